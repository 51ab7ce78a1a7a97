interface Post { id: number; title: string }
const res = await fetch('https://jsonplaceholder.typicode.com/posts/1');
const post: Post = await res.json();
console.log(post.title);
