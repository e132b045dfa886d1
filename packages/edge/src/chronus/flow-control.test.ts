// Flow control between the edge's client and a real chronus (unprivileged, on a socket pair, no
// root): an attached stream nobody reads stops the agent reading the process's pipe at its output
// cap (the process blocks, nothing is dropped) and the client holds at most the window; a reader
// then gets every byte, with one ACK per half window consumed.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { after, test } from 'node:test';
import { ChronusClient } from './client.js';
import { T } from './wire.js';

const CHRONUS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../chronus/build/chronus');
const MiB = 2 ** 20;
const OUTPUT_CAP_BYTES = MiB;
const WINDOW_BYTES = 256 * 1024;
const TOTAL_BYTES = 16 * MiB;

const agents: ChildProcess[] = [];
after(() => {
  for (const a of agents) a.kill('SIGKILL');
});

test('an unread stream holds its process at the output cap and the client at the window; read, every byte arrives with an ACK per half window', async () => {
  const agent = spawn(CHRONUS, ['--stream-fd', '3', '--output-cap', String(OUTPUT_CAP_BYTES)], { stdio: ['ignore', 'ignore', 'ignore', 'pipe'] });
  agents.push(agent);
  const client = new ChronusClient(agent.stdio[3] as Duplex);
  try {
    const att = await client.spawn({ argv: ['head', '-c', String(TOTAL_BYTES), '/dev/zero'], windowBytes: WINDOW_BYTES });
    const produced = async (): Promise<{ bytes: number; running: boolean }> => {
      const p = (await client.list()).find((x) => x.proc === att.proc);
      assert.ok(p);
      return { bytes: p.stdoutBytes, running: p.running };
    };
    for (let i = 0; i < 200 && (await produced()).bytes < OUTPUT_CAP_BYTES; i++) await sleep(10);
    await sleep(200);
    assert.deepEqual(await produced(), { bytes: OUTPUT_CAP_BYTES, running: true }, 'the agent stopped reading at its cap');
    assert.ok(att.received.stdout <= WINDOW_BYTES, `the client holds ${att.received.stdout} bytes unread`);

    let acks = 0;
    const send = client.send.bind(client);
    client.send = (type, id, fields) => {
      if (type === T.ACK) acks++;
      send(type, id, fields);
    };
    let bytes = 0;
    for await (const ev of att) if (ev.kind === 'data') bytes += ev.data.length;
    assert.equal(bytes, TOTAL_BYTES);
    assert.equal((await att.exited).exitCode, 0);
    assert.ok(acks >= TOTAL_BYTES / WINDOW_BYTES && acks <= TOTAL_BYTES / (WINDOW_BYTES / 2), `${acks} ACKs for ${TOTAL_BYTES / MiB} MiB`);
  } finally {
    client.close();
  }
});
