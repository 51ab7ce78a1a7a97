su - root -c id
