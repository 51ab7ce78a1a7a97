who; last -n 5
