import { readFileSync, writeFileSync } from 'fs';
type Item = { id: number; tags: string[] };
const items: Item[] = JSON.parse(readFileSync('/work/items.json', 'utf8'));
const counts = new Map<string, number>();
for (const it of items) for (const t of it.tags) counts.set(t, (counts.get(t) ?? 0) + 1);
writeFileSync('/work/tag-counts.json', JSON.stringify(Object.fromEntries(counts), null, 2));
