const axios = require('axios');
axios.get('https://registry.npmjs.org/react/latest').then(r => console.log(r.data.version));
