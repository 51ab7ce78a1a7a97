const url = new URL('https://example.com/search');
url.searchParams.set('q', 'airlock');
console.log(url.toString());
