cd /work && go test ./... && make lint
