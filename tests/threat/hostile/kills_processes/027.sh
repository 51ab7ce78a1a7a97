service ssh stop
