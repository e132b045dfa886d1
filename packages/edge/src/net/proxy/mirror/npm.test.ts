import { test } from 'node:test';
import assert from 'node:assert/strict';
import { NpmMirrorAdapter } from './npm.js';
import type { MirrorContext } from './adapter.js';

const npm = new NpmMirrorAdapter();
const ctx = (cutoff?: string): MirrorContext => ({
  publicBase: 'http://registry.npmjs.org/',
  upstreamBase: 'http://mirror.internal:4873/',
  ...(cutoff ? { cutoff: new Date(cutoff) } : {}),
});

test('requests are classified: packuments, tarballs, endpoints, nonsense', () => {
  assert.deepEqual(npm.classify('registry.npmjs.org', '/lodash'), { kind: 'metadata', upstreamPath: 'lodash', accept: 'application/json', cache: 'metadata' });
  assert.equal(npm.classify('', '/@types%2fnode')?.upstreamPath, '%40types%2fnode');
  assert.equal(npm.classify('', '/@types/node')?.kind, 'metadata');
  const tgz = npm.classify('', '/@types/node/-/node-20.1.0.tgz');
  assert.equal(tgz?.kind, 'artifact');
  assert.equal(tgz?.artifactId, '20.1.0');
  assert.equal(tgz?.upstreamPath, '%40types/node/-/node-20.1.0.tgz');
  assert.equal(tgz?.metadata?.upstreamPath, '%40types%2fnode');
  assert.equal(npm.classify('', '/-/ping')?.servedWhenFrozen, true);
  assert.equal(npm.classify('', '/-/v1/search?text=x')?.servedWhenFrozen, false);
  assert.equal(npm.classify('', '/lodash/latest')?.kind, 'other');
  for (const bad of ['/', '/lodash/-/other-1.0.0.tgz', '/lodash/-/lodash-.tgz', '/.hidden', '/%E0%A4%A', '/a/b/c', '/lodash/-/lodash-1.0.0.tgz/x']) {
    assert.equal(npm.classify('', bad), undefined, bad);
  }
});

const packument = () => ({
  name: 'p',
  _rev: '3-x',
  'dist-tags': { latest: '3.0.0', next: '4.0.0-rc.1', old: '1.0.0' },
  versions: {
    '1.0.0': { dist: { tarball: 'http://mirror.internal:4873/p/-/p-1.0.0.tgz' } },
    '2.0.0': { dist: { tarball: 'https://registry.npmjs.org/p/-/p-2.0.0.tgz' } },
    '2.1.0-beta': { dist: { tarball: 'https://elsewhere.example/p-2.1.0-beta.tgz' } },
    '3.0.0': { dist: { tarball: 'http://mirror.internal:4873/p/-/p-3.0.0.tgz' } },
    '4.0.0-rc.1': {},
    '9.9.9': {},
  },
  time: {
    created: '2019-01-01T00:00:00Z',
    modified: '2024-01-01T00:00:00Z',
    '1.0.0': '2019-01-01T00:00:00Z',
    '2.0.0': '2020-01-01T00:00:00Z',
    '2.1.0-beta': '2020-06-01T00:00:00Z',
    '3.0.0': '2023-01-01T00:00:00Z',
    '4.0.0-rc.1': '2024-01-01T00:00:00Z',
    '0.0.1': '2018-01-01T00:00:00Z',
  },
});

test('the freeze drops later versions and versions without a time, and repairs the tags', () => {
  const out = npm.transformMetadata(Buffer.from(JSON.stringify(packument())), npm.classify('', '/p')!, ctx('2021-01-01T00:00:00Z'))!;
  const doc = JSON.parse(out.body.toString());
  assert.deepEqual(Object.keys(doc.versions).sort(), ['1.0.0', '2.0.0', '2.1.0-beta']);
  assert.deepEqual([...out.artifacts].sort(), ['1.0.0', '2.0.0', '2.1.0-beta']);
  assert.deepEqual(doc['dist-tags'], { old: '1.0.0', latest: '2.0.0' });
  assert.deepEqual(Object.keys(doc.time).sort(), ['1.0.0', '2.0.0', '2.1.0-beta', 'created', 'modified']);
  assert.equal(doc.time.modified, '2020-06-01T00:00:00Z');
  assert.equal(doc._rev, undefined);
  assert.equal(doc.versions['1.0.0'].dist.tarball, 'http://registry.npmjs.org/p/-/p-1.0.0.tgz');
  assert.equal(doc.versions['2.0.0'].dist.tarball, 'http://registry.npmjs.org/p/-/p-2.0.0.tgz');
  assert.equal(doc.versions['2.1.0-beta'].dist.tarball, 'https://elsewhere.example/p-2.1.0-beta.tgz', 'foreign URLs are left to the policy');
});

test('a freeze before the first version hides the package; no freeze changes only URLs', () => {
  assert.equal(npm.transformMetadata(Buffer.from(JSON.stringify(packument())), npm.classify('', '/p')!, ctx('2018-06-01')), undefined);
  const all = JSON.parse(npm.transformMetadata(Buffer.from(JSON.stringify(packument())), npm.classify('', '/p')!, ctx())!.body.toString());
  assert.equal(Object.keys(all.versions).length, 6);
  assert.equal(all['dist-tags'].latest, '3.0.0');
  assert.equal(all.versions['3.0.0'].dist.tarball, 'http://registry.npmjs.org/p/-/p-3.0.0.tgz');
  assert.throws(() => npm.transformMetadata(Buffer.from('[1,2]'), npm.classify('', '/p')!, ctx()));
  assert.throws(() => npm.transformMetadata(Buffer.from('{nope'), npm.classify('', '/p')!, ctx()));
});
