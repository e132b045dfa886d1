import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { isDsecError } from '@dsec/protocol';
import { HelperProcess } from './helper-process.js';

// A helper in shell: reads "ID WHAT" lines; "echo X" answers "ID X", "later N X" answers after N
// seconds (in the background, so later requests overtake it), "die" writes to stderr and exits,
// "mute" answers nothing; `started` counts its starts.
const SCRIPT = `
echo start >> "$1"
while read -r id what a b; do
  case "$what" in
    echo) echo "$id $a" ;;
    later) (sleep "$a"; echo "$id $b") & ;;
    die) echo "helper gave up on $id" >&2; exit 3 ;;
    mute) ;;
  esac
done
`;

let dir: string;
let script: string;
let started: string;
const helpers: Array<HelperProcess<string>> = [];

const helper = (): HelperProcess<string> => {
  const h = new HelperProcess<string>({
    name: 'test helper',
    binary: '/bin/sh',
    args: [script, started],
    parse: (line) => {
      const m = /^(\d+) (.*)$/.exec(line);
      return m ? { id: Number(m[1]), value: m[2] ?? '' } : undefined;
    },
    closeTimeoutMs: 2_000,
  });
  helpers.push(h);
  return h;
};

const ask = (h: HelperProcess<string>, what: string, timeoutMs = 10_000, onTimeout?: () => void): Promise<string> => {
  const id = h.nextId();
  return h.request(id, `${id} ${what}\n`, { timeoutMs, ...(onTimeout ? { onTimeout } : {}) });
};

const starts = async (): Promise<number> => (await readFile(started, 'utf8')).split('\n').filter(Boolean).length;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-helper-'));
  script = path.join(dir, 'helper.sh');
  started = path.join(dir, 'started');
  await writeFile(script, SCRIPT);
  await writeFile(started, '');
});

after(async () => {
  for (const h of helpers) await h.close();
  await rm(dir, { recursive: true, force: true });
});

test('answers are matched to their requests by id, in any order, from one process', async () => {
  const h = helper();
  const slow = ask(h, 'later 0.3 slow');
  const fast = await Promise.all([ask(h, 'echo a'), ask(h, 'echo b')]);
  assert.deepEqual(fast, ['a', 'b']);
  assert.equal(h.inFlight, 1);
  assert.equal(await slow, 'slow');
  assert.equal(h.inFlight, 0);
  assert.equal(await starts(), 1);
  await h.close();
});

test('a helper that dies fails what is in flight with its standard error and starts again on the next request', async () => {
  await writeFile(started, '');
  const h = helper();
  const waiting = ask(h, 'mute');
  await assert.rejects(ask(h, 'die'), (err: unknown) => isDsecError(err, 'BACKEND_FAILED') && /test helper: helper gave up on \d+/.test(err.message));
  await assert.rejects(waiting, (err: unknown) => isDsecError(err, 'BACKEND_FAILED'));
  assert.equal(await ask(h, 'echo again'), 'again');
  assert.equal(await starts(), 2);
  await h.close();
});

test('a request times out (TIMEOUT), or with onTimeout goes on waiting for its answer; close fails what is left', async () => {
  const h = helper();
  await assert.rejects(ask(h, 'mute', 100), (err: unknown) => isDsecError(err, 'TIMEOUT'));
  assert.equal(h.inFlight, 0);
  let timedOut = 0;
  assert.equal(await ask(h, 'later 0.4 late', 100, () => timedOut++), 'late');
  assert.equal(timedOut, 1);
  const left = assert.rejects(ask(h, 'mute'), (err: unknown) => isDsecError(err, 'BACKEND_FAILED') && /closing/.test(err.message));
  await h.close();
  await left;
});

test('a binary that cannot be started fails its request', async () => {
  const h = new HelperProcess<string>({ name: 'missing', binary: path.join(dir, 'no-such-binary'), parse: () => undefined });
  helpers.push(h);
  await assert.rejects(
    h.request(1, '1\n', { timeoutMs: 10_000 }),
    (err: unknown) => isDsecError(err, 'BACKEND_FAILED') && /missing: .*ENOENT/.test(err.message),
  );
});

test('an idle helper does not keep its owner process alive', () => {
  // The owner makes one request, gets its answer and neither closes nor exits by hand.
  const code = `
    const { HelperProcess } = await import(${JSON.stringify(new URL('./helper-process.js', import.meta.url).href)});
    const h = new HelperProcess({ name: 'idle', binary: '/bin/sh', args: [${JSON.stringify(script)}, ${JSON.stringify(started)}],
      parse: (l) => { const [id, v] = l.split(' '); return { id: Number(id), value: v }; } });
    const id = h.nextId();
    console.log(await h.request(id, id + ' echo done\\n', { timeoutMs: 10000 }));
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, 'done\n');
});
