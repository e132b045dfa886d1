// A directory download whose tree changes under it: entries that went away are left out, and a
// failure of the walk breaks the download without ever becoming an uncaught exception. A
// directory upload refuses oversized PAX headers.
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { describe, test } from 'node:test';
import tar from 'tar-stream';
import { DsecError, MAX_TAR_BYTES_BETWEEN_ENTRIES, MAX_TAR_EXTENDED_HEADER_BYTES, MAX_TAR_PAX_RECORDS } from '@dsec/protocol';
import type { EdgeClient, FileStat } from '@dsec/protocol';
import { downloadTar, MAX_TAR_DOWNLOAD_BYTES, uploadTar } from './tar-files.js';

const entry = (name: string, type: FileStat['type']): FileStat => ({ name, type, mode: 0o644, size: 1, mtimeMs: 0 });

/** An edge whose sandbox tree is /work holding a file `a`, a directory `d` and whatever `gone` fails with. */
function edgeWith(listRoot: () => Promise<FileStat[]>): EdgeClient {
  const gone = (): Promise<never> => Promise.reject(new DsecError('FILE_NOT_FOUND', 'gone'));
  return {
    listDir: (_id: string, p: string) => (p === '/work' ? listRoot() : gone()),
    readFile: (_id: string, p: string) => (p === '/work/a' ? Promise.resolve(Buffer.from('x')) : gone()),
    stat: () => Promise.resolve(entry('d', 'dir')),
  } as unknown as EdgeClient;
}

async function drain(stream: NodeJS.ReadableStream): Promise<number> {
  let bytes = 0;
  for await (const chunk of stream) bytes += (chunk as Buffer).length;
  return bytes;
}

describe('tar download of a changing tree', () => {
  test('entries gone since they were listed are left out; the rest is archived', async () => {
    const edge = edgeWith(() => Promise.resolve([entry('a', 'file'), entry('b', 'file'), entry('d', 'dir')]));
    assert.ok((await drain(downloadTar(edge, 'sb', '/work'))) > 0);
  });

  test('a walk that fails breaks the stream, and nothing is thrown uncaught', async () => {
    const uncaught: unknown[] = [];
    const onUncaught = (err: unknown): void => void uncaught.push(err);
    process.on('uncaughtException', onUncaught);
    try {
      const edge = edgeWith(() => new Promise((_, reject) => setTimeout(() => reject(new DsecError('FILE_NOT_FOUND', 'readdir /work: gone')), 5)));
      await assert.rejects(drain(downloadTar(edge, 'sb', '/work')), /gone/);
      await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(uncaught, []);
    } finally {
      process.off('uncaughtException', onUncaught);
    }
  });
});

/** A tar of one file `f` holding `content`, with the PAX records `pax`. */
async function tarWithPax(content: string, pax: Record<string, string>): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const done = (async () => {
    for await (const c of pack) chunks.push(c as Buffer);
  })();
  await new Promise<void>((resolve, reject) => pack.entry({ name: 'f', mode: 0o644, pax }, content, (err) => (err ? reject(err) : resolve())));
  pack.finalize();
  await done;
  return Buffer.concat(chunks);
}

describe('tar upload', () => {
  test(
    'PAX headers: a small one passes; over 1 MiB, with too many records or never reaching an entry is 400 naming the body and the PAX header',
    { timeout: 30_000 },
    async () => {
      const written = new Map<string, string>();
      const edge = {
        mkdir: () => Promise.resolve(),
        writeFile: (_id: string, p: string, data: Buffer) => {
          written.set(p, data.toString());
          return Promise.resolve();
        },
      } as unknown as EdgeClient;
      const upload = async (body: Buffer): Promise<unknown> => uploadTar(edge, 'sb', '/work', Readable.from([body]), MAX_TAR_DOWNLOAD_BYTES);
      assert.deepEqual(await upload(await tarWithPax('small', { comment: 'ok' })), { files: 1 });
      assert.equal(written.get('/work/f'), 'small');
      const refused = (pattern: RegExp) => (err: unknown) => {
        assert.ok(err instanceof DsecError, String(err));
        assert.equal(err.status, 400);
        assert.equal(err.details.field, 'body');
        assert.match(err.message, /PAX extended header/);
        assert.match(err.message, pattern);
        return true;
      };
      await assert.rejects(upload(await tarWithPax('x', { comment: 'c'.repeat(MAX_TAR_EXTENDED_HEADER_BYTES + 1000) })), refused(/bytes/));
      await assert.rejects(upload(await tarWithPax('x', { comment: 'c'.repeat(5 * 1024 * 1024) })), refused(/bytes/));
      const many = Object.fromEntries(Array.from({ length: MAX_TAR_PAX_RECORDS + 1 }, (_, i) => [`k${i}`, 'v']));
      await assert.rejects(upload(await tarWithPax('x', many)), refused(/records/));
      // A run of extended headers that never reaches an entry: refused after a bounded read.
      const whole = await tarWithPax('x', { comment: 'c'.repeat(256 * 1024) });
      const part = whole.subarray(0, whole.length - 4 * 512);
      let sent = 0;
      const endless = Readable.from(
        (function* () {
          for (;;) {
            sent += part.length;
            yield part;
          }
        })(),
      );
      await assert.rejects(uploadTar(edge, 'sb', '/work', endless, MAX_TAR_DOWNLOAD_BYTES), refused(/no tar entry after them/));
      assert.ok(sent <= MAX_TAR_BYTES_BETWEEN_ENTRIES + 4 * part.length, `${sent} bytes read`);
    },
  );
});
