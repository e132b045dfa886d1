// A directory download whose tree changes under it: entries that went away are left out, and a
// failure of the walk breaks the download without ever becoming an uncaught exception.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import type { EdgeClient, FileStat } from '@dsec/protocol';
import { downloadTar } from './tar-files.js';

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
