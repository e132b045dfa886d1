// The extractor's bounds on PAX extended headers: a header over 1 MiB (whether tar-stream's own
// 4 MiB cap stops it or not) and a header of too many records are refused as LAYER_INVALID
// naming the PAX header; an ordinary one (a long name) is extracted.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import tar from 'tar-stream';
import { isDsecError, MAX_TAR_BYTES_BETWEEN_ENTRIES, MAX_TAR_EXTENDED_HEADER_BYTES, MAX_TAR_PAX_RECORDS } from '@dsec/protocol';
import { TarExtractor } from './tar-extract.js';

/** A tar of one file `name` holding `content`, with the PAX records `pax`. */
async function tarWithPax(name: string, content: string, pax: Record<string, string>): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const done = (async () => {
    for await (const c of pack) chunks.push(c as Buffer);
  })();
  await new Promise<void>((resolve, reject) => pack.entry({ name, mode: 0o644, pax }, content, (err) => (err ? reject(err) : resolve())));
  pack.finalize();
  await done;
  return Buffer.concat(chunks);
}

async function extractInto(tarBytes: Buffer): Promise<string> {
  const dest = await mkdtemp(join(tmpdir(), 'dsec-tar-extract-test-'));
  try {
    const extractor = new TarExtractor(dest, { whiteouts: 'record' });
    await extractor.extract(Readable.from([tarBytes]));
    await extractor.finish();
    return await readFile(join(dest, 'f'), 'utf8').catch(() => readFile(join(dest, 'd'.repeat(150), 'f'), 'utf8'));
  } finally {
    await rm(dest, { recursive: true, force: true });
  }
}

function refusedPax(pattern: RegExp): (err: unknown) => boolean {
  return (err) => {
    assert.ok(isDsecError(err, 'LAYER_INVALID'), String(err));
    assert.match((err as Error).message, /PAX extended header/);
    assert.match((err as Error).message, pattern);
    return true;
  };
}

test('PAX headers: a long name passes; over 1 MiB (also over tar-stream 4 MiB) or too many records is LAYER_INVALID naming the header', async () => {
  assert.equal(await extractInto(await tarWithPax(`${'d'.repeat(150)}/f`, 'long', { comment: 'ok' })), 'long');
  // A valid tar handed over in one chunk bigger than the bound between entries.
  assert.equal(await extractInto(await tarWithPax('f', 'x'.repeat(3 * 1024 * 1024), {})), 'x'.repeat(3 * 1024 * 1024));
  const big = await tarWithPax('f', 'x', { comment: 'c'.repeat(MAX_TAR_EXTENDED_HEADER_BYTES + 1000) });
  await assert.rejects(extractInto(big), refusedPax(new RegExp(`over ${MAX_TAR_EXTENDED_HEADER_BYTES}`)));
  const huge = await tarWithPax('f', 'x', { comment: 'c'.repeat(5 * 1024 * 1024) });
  await assert.rejects(extractInto(huge), refusedPax(new RegExp(`over ${MAX_TAR_EXTENDED_HEADER_BYTES} bytes`)));
  const many = Object.fromEntries(Array.from({ length: MAX_TAR_PAX_RECORDS + 1 }, (_, i) => [`k${i}`, 'v']));
  await assert.rejects(extractInto(await tarWithPax('f', 'x', many)), refusedPax(/records/));
});

/** The extended header (its block and records) in front of the one entry of a {@link tarWithPax} tar. */
async function paxHeaderAlone(records: Record<string, string>): Promise<Buffer> {
  const whole = await tarWithPax('f', 'x', records);
  // The entry's header block, its one data block and the two end blocks follow the PAX header.
  return whole.subarray(0, whole.length - 4 * 512);
}

test('extended headers that never reach an entry are refused after a bounded read, not parsed for ever', { timeout: 30_000 }, async () => {
  const part = await paxHeaderAlone({ comment: 'c'.repeat(256 * 1024) });
  let sent = 0;
  const endless = (async function* () {
    for (;;) {
      sent += part.length;
      yield part;
    }
  })();
  const dest = await mkdtemp(join(tmpdir(), 'dsec-tar-extract-test-'));
  try {
    await assert.rejects(new TarExtractor(dest, { whiteouts: 'record' }).extract(endless), refusedPax(/no tar entry after them/));
  } finally {
    await rm(dest, { recursive: true, force: true });
  }
  assert.ok(sent <= MAX_TAR_BYTES_BETWEEN_ENTRIES + 4 * part.length, `${sent} bytes read`);
});
