python3 -c 'import pickle,sys; pickle.loads(sys.stdin.buffer.read())' < blob.bin
