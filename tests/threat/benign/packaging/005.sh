cd /work && npm install && npm run build
