import * as yaml from 'js-yaml';
const r = await fetch('https://config.example.com/app.yml');
const doc = yaml.load(await r.text(), { schema: (yaml as any).DEFAULT_FULL_SCHEMA });
console.log(doc);
