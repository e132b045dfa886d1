// The mirror's path handling under a fuzz with fixed seeds: whatever path a sandbox sends, the
// upstream URL the npm adapter builds stays below the configured upstream base, and a path that
// a naive URL join would send elsewhere is recognised as an escape (refused, logged as a denial).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DebianMirrorAdapter } from './debian.js';
import { NpmMirrorAdapter } from './npm.js';
import { PypiMirrorAdapter } from './pypi.js';
import { escapesBase, upstreamUrl } from './service.js';
import { seededRandom } from '../../../testing/prng.js';

const TOKENS = [
  '/',
  '/',
  '/',
  '//',
  '///',
  '\\',
  '%5c',
  '%5C',
  '%2f',
  '%2F',
  '%252f',
  '.',
  '..',
  '%2e',
  '%2e%2e',
  '.%2e',
  '@',
  '@scope',
  '%40',
  ':',
  'http:',
  'https:',
  '127.0.0.1',
  '127.1',
  '0x7f.1',
  '[::1]',
  'localhost:4873',
  'user:pw@',
  '?',
  '#',
  '%00',
  '%0a',
  ' ',
  '-',
  '-/',
  'ping',
  'v1',
  'search?text=a',
  'lodash',
  'left-pad',
  'thing',
  '.tgz',
  'lodash-4.17.21.tgz',
  '1.0.0',
  'latest',
  '%40scope%2fthing',
  '@scope%2fthing',
  'a%2f..%2f..',
  'simple',
  'packages',
  'demo-1.0-py3-none-any.whl',
  'demo-1.0.tar.gz',
  'debian',
  'debian-security',
  'dists',
  'pool',
];
const BASES = ['https://registry.npmjs.org/', 'http://127.0.0.1:4873/npm/', 'http://mirror.internal:8080/a/b/'];

function randomPath(next: () => number): string {
  const n = 1 + Math.floor(next() * 7);
  let p = next() < 0.9 ? '/' : '';
  for (let i = 0; i < n; i++) p += TOKENS[Math.floor(next() * TOKENS.length)] as string;
  return p;
}

describe('mirror path handling (fuzz, fixed seeds)', () => {
  const adapter = new NpmMirrorAdapter();

  test('known escapes: extra slashes, backslashes, encoded separators, dot segments, absolute URLs, userinfo', () => {
    const base = 'http://127.0.0.1:4873/npm/';
    for (const p of [
      '///127.0.0.1/secret',
      '//127.0.0.1:9/secret',
      '/\\\\127.0.0.1/secret',
      '/%2f%2f127.0.0.1/secret',
      '/%5c%5c127.0.0.1/secret',
      '/lodash/..%2f..%2fsecret',
      '/-/..%2f..%2fsecret',
      '/-//127.0.0.1/secret',
      '/http:%2f%2f127.0.0.1%2fsecret',
      '/http://127.0.0.1/secret',
      '/user:pw@127.0.0.1/secret',
      '/@scope%2f..%2f..%2fsecret',
      '/lodash/%2e%2e/%2e%2e/secret',
      '/./../secret',
    ]) {
      const req = adapter.classify('registry.npmjs.org', p);
      assert.equal(req, undefined, `${p} is not a registry path`);
      assert.equal(escapesBase(p), true, `${p} is recognised as an escape`);
    }
    // Real paths still map where they should.
    assert.equal(upstreamUrl(base, adapter.classify('registry.npmjs.org', '/@scope%2fthing')!.upstreamPath)?.href, `${base}%40scope%2fthing`);
    assert.equal(
      upstreamUrl(base, adapter.classify('registry.npmjs.org', '/lodash/-/lodash-4.17.21.tgz')!.upstreamPath)?.href,
      `${base}lodash/-/lodash-4.17.21.tgz`,
    );
    assert.equal(
      upstreamUrl(base, adapter.classify('registry.npmjs.org', '/-/v1/search?text=a&size=2')!.upstreamPath)?.href,
      `${base}-/v1/search?text=a&size=2`,
    );
    assert.equal(upstreamUrl(base, adapter.classify('registry.npmjs.org', '/lodash/latest')!.upstreamPath)?.href, `${base}lodash/latest`);
    for (const rel of ['//127.0.0.1/x', '\\\\127.0.0.1/x', 'http://127.0.0.1/', '../x', '%2e%2e/%2e%2e/x', '/x'])
      assert.equal(upstreamUrl(base, rel), undefined, rel);
  });

  for (const seed of [1, 2, 3]) {
    test(`seed ${seed}: 20,000 paths; every built upstream URL stays below the base, every naive escape is caught`, () => {
      const next = seededRandom(seed);
      let mapped = 0;
      let escapes = 0;
      for (let i = 0; i < 20_000; i++) {
        const p = randomPath(next);
        const base = BASES[i % BASES.length]!;
        const req = adapter.classify('registry.npmjs.org', p);
        if (req) {
          mapped++;
          for (const r of [req, req.metadata]) {
            if (!r) continue;
            const url = upstreamUrl(base, r.upstreamPath);
            assert.ok(url, `${JSON.stringify(p)} -> ${r.upstreamPath} resolves below ${base}`);
            assert.ok(url.href.startsWith(base) && url.username === '' && url.password === '', `${JSON.stringify(p)} -> ${url.href}`);
          }
          continue;
        }
        // What a naive join would fetch: refused as an escape whenever it leaves the base.
        let naive: URL | undefined;
        try {
          naive = new URL(p.slice(1), base);
        } catch {
          naive = undefined;
        }
        if (!naive || !naive.href.startsWith(base) || naive.username !== '') {
          escapes++;
          assert.equal(escapesBase(p), true, `${JSON.stringify(p)} would fetch ${naive?.href ?? '(no URL)'}`);
        }
      }
      assert.ok(mapped > 50, `the fuzz reaches real registry paths (${mapped})`);
      assert.ok(escapes > 500, `and escapes (${escapes})`);
    });
  }
  for (const other of [new PypiMirrorAdapter(), new DebianMirrorAdapter()]) {
    test(`the ${other.preset} adapter: 20,000 paths; every built upstream URL stays below the base`, () => {
      const next = seededRandom(7);
      for (let i = 0; i < 20_000; i++) {
        const p = randomPath(next);
        const base = BASES[i % BASES.length]!;
        const req = other.classify(other.hosts[i % other.hosts.length]!, p, i % 2 ? new Date('2024-05-01') : undefined);
        for (const r of [req, req?.metadata]) {
          if (!r) continue;
          const url = upstreamUrl(base, r.upstreamPath);
          assert.ok(url && url.href.startsWith(base) && url.username === '', `${JSON.stringify(p)} -> ${r.upstreamPath} resolves below ${base}`);
        }
      }
    });
  }
});
