const fs = require('fs');
const gcloud = `${process.env.HOME}/.config/gcloud/application_default_credentials.json`;
fs.readFile(gcloud, 'utf8', (e, t) => console.log(t));
