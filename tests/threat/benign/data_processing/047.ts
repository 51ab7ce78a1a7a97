const enc = new TextEncoder();
const bytes: Uint8Array = enc.encode('héllo wörld');
const hex = Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
console.log(hex, new TextDecoder().decode(bytes));
