// Test helper process: a layer store with lazy loading that mounts one layer and then waits to be
// killed (what an edge killed mid-read leaves: the layer mounted over its lazy server's FUSE view).
// argv: <store root> <registry url> <user> <password> <layer digest>; prints the mount directory.
import path from 'node:path';
import { LayerRegistry, LayerStore } from '@dsec/edge';
import { REPO_ROOT } from './node.js';

const [root, url, username, password, digest] = process.argv.slice(2) as [string, string, string, string, string];
const store = new LayerStore({
  root,
  registry: new LayerRegistry({ url, username, password }),
  unmountLingerMs: 0,
  lazy: { lazyfsBinary: path.join(REPO_ROOT, 'chronus/build/dsec-lazyfs'), deadlineMs: 5000 },
});
await store.fetch(digest);
process.stdout.write(`${await store.acquire(digest)}\n`);
setInterval(() => undefined, 60_000);
