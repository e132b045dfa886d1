import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { MirrorContext } from './adapter.js';
import { normalizeProject, parseDistributionFile, PYPI_SIMPLE_JSON, PypiMirrorAdapter } from './pypi.js';

const pypi = new PypiMirrorAdapter();
const ctx = (cutoff?: string, upstreamBase = 'http://mirror.internal:3141/'): MirrorContext => ({
  publicBase: 'http://pypi.org/',
  upstreamBase,
  ...(cutoff ? { cutoff: new Date(cutoff) } : {}),
});

test('names and file names: PEP 503 normalisation, wheels, sdists with dashes', () => {
  assert.equal(normalizeProject('Foo.Bar__baz'), 'foo-bar-baz');
  assert.deepEqual(parseDistributionFile('Foo_Bar-1.2.3-py3-none-any.whl'), { project: 'foo-bar', version: '1.2.3' });
  assert.deepEqual(parseDistributionFile('python-dateutil-2.8.2.tar.gz'), { project: 'python-dateutil', version: '2.8.2' });
  assert.deepEqual(parseDistributionFile('demo-1.0.zip'), { project: 'demo', version: '1.0' });
  assert.equal(parseDistributionFile('README.txt'), undefined);
});

test('requests are classified: pages, files on either host, PEP 658 metadata, the JSON API, nonsense', () => {
  assert.deepEqual(pypi.classify('pypi.org', '/simple/Foo_Bar/'), {
    kind: 'metadata',
    upstreamPath: 'simple/foo-bar/',
    accept: PYPI_SIMPLE_JSON,
    cache: 'metadata',
    host: 'pypi.org',
  });
  assert.equal(pypi.classify('pypi.org', '/simple/foo')?.upstreamPath, 'simple/foo/');
  assert.equal(pypi.classify('pypi.org', '/simple/')?.servedWhenFrozen, true);
  const file = pypi.classify('files.pythonhosted.org', '/packages/ab/cd/ef/demo-1.0%2Blocal-py3-none-any.whl')!;
  assert.equal(file.kind, 'artifact');
  assert.equal(file.artifactId, 'demo-1.0+local-py3-none-any.whl');
  assert.equal(file.upstreamPath, 'packages/ab/cd/ef/demo-1.0%2Blocal-py3-none-any.whl');
  assert.equal(file.metadata?.upstreamPath, 'simple/demo/');
  assert.equal(file.metadata?.host, 'pypi.org');
  assert.equal(pypi.classify('pypi.org', '/packages/x/demo-1.0.tar.gz.metadata')?.artifactId, 'demo-1.0.tar.gz');
  assert.equal(pypi.classify('pypi.org', '/pypi/demo/json')?.kind, 'other');
  assert.equal(pypi.classify('pypi.org', '/pypi/demo/json')?.servedWhenFrozen, undefined);
  for (const bad of ['/', '/simple/a/b', '/simple/..', '/packages/x/README', '/packages/%2e%2e/demo-1.0.tar.gz', '/simple/a?x=1', '/x', '//simple/a/']) {
    assert.equal(pypi.classify('pypi.org', bad), undefined, bad);
  }
  assert.equal(pypi.classify('files.pythonhosted.org', '/simple/demo/'), undefined);
});

test('upstream bases: the public index keeps files on their own origin, a mirror serves its own', () => {
  assert.equal(pypi.upstreamBase('https://pypi.org/', undefined, 'files.pythonhosted.org'), 'https://files.pythonhosted.org/');
  assert.equal(pypi.upstreamBase('https://pypi.org', undefined, 'pypi.org'), 'https://pypi.org/');
  assert.equal(pypi.upstreamBase('http://devpi:3141/root/', undefined, 'files.pythonhosted.org'), 'http://devpi:3141/root/');
});

const page = () => ({
  meta: { 'api-version': '1.1' },
  name: 'demo',
  versions: ['1.0', '2.0', '3.0'],
  files: [
    {
      filename: 'demo-1.0.tar.gz',
      url: '../../packages/demo-1.0.tar.gz',
      hashes: { sha256: 'a'.repeat(64) },
      'core-metadata': { sha256: 'b'.repeat(64) },
      'upload-time': '2023-01-01T00:00:00Z',
    },
    {
      filename: 'demo-2.0-py3-none-any.whl',
      url: 'https://files.pythonhosted.org/packages/aa/demo-2.0-py3-none-any.whl',
      hashes: {},
      'upload-time': '2024-01-01T00:00:00.123456Z',
    },
    {
      filename: 'demo-3.0-py3-none-any.whl',
      url: 'http://mirror.internal:3141/packages/demo-3.0-py3-none-any.whl',
      hashes: {},
      'upload-time': '2025-01-01T00:00:00Z',
    },
    { filename: 'demo-3.0.tar.gz', url: 'https://elsewhere.example/demo-3.0.tar.gz', hashes: {} },
  ],
});

test('frozen pages lose later files (and files without an upload time); URLs come back through the proxy', () => {
  const req = pypi.classify('pypi.org', '/simple/demo/')!;
  const out = pypi.transformMetadata(Buffer.from(JSON.stringify(page())), req, ctx('2024-06-01'))!;
  assert.equal(out.contentType, PYPI_SIMPLE_JSON);
  assert.deepEqual([...out.artifacts], ['demo-1.0.tar.gz', 'demo-2.0-py3-none-any.whl']);
  // Files are checked (and cached) by the SHA-256 the page gives, their PEP 658 metadata too.
  assert.deepEqual(
    [...out.digests!],
    [
      ['demo-1.0.tar.gz', 'a'.repeat(64)],
      ['demo-1.0.tar.gz.metadata', 'b'.repeat(64)],
    ],
  );
  assert.equal(pypi.classify('pypi.org', '/packages/demo-1.0.tar.gz.metadata')?.digestId, 'demo-1.0.tar.gz.metadata');
  const doc = JSON.parse(out.body.toString()) as ReturnType<typeof page>;
  assert.deepEqual(doc.versions, ['1.0', '2.0']);
  assert.deepEqual(
    doc.files.map((f) => f.url),
    ['http://pypi.org/packages/demo-1.0.tar.gz', 'http://files.pythonhosted.org/packages/aa/demo-2.0-py3-none-any.whl'],
  );
  assert.equal(pypi.transformMetadata(Buffer.from(JSON.stringify(page())), req, ctx('2020-01-01')), undefined);
  const all = pypi.transformMetadata(Buffer.from(JSON.stringify(page())), req, ctx())!;
  assert.equal(all.artifacts.size, 4);
  assert.equal((JSON.parse(all.body.toString()) as ReturnType<typeof page>).files[3]!.url, 'https://elsewhere.example/demo-3.0.tar.gz');
  assert.throws(() => pypi.transformMetadata(Buffer.from('<html></html>'), req, ctx()), /PEP 691/);
  assert.throws(() => pypi.transformMetadata(Buffer.from('{"files": 1}'), req, ctx()), /PEP 691/);
});
