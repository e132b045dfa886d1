// QmpScreen against a real QEMU: a bare q35 machine with OVMF and no disk reaches the UEFI shell,
// which shows text and echoes what is typed. One QEMU of its own in a temporary directory.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ScreenActionsSchema, parseOrThrow } from '@dsec/protocol';
import type { DsecError, ScreenAction } from '@dsec/protocol';
import { QmpClient } from './qmp.js';
import { QmpScreen } from './screen.js';
import { decodePng } from '../../testing/png.js';
import { socketStream } from '../../screens.js';

const OVMF = '/usr/share/OVMF/OVMF_CODE_4M.fd';
const QEMU = '/usr/bin/qemu-system-x86_64';
const skip = !existsSync(OVMF) || !existsSync(QEMU) ? 'needs qemu-system-x86 and ovmf' : false;

/** Rows (of 16 px) whose pixels differ between two screenshots of one size. */
function changedRows(a: Uint8Array, b: Uint8Array): number[] {
  const pa = decodePng(a);
  const pb = decodePng(b);
  assert.deepEqual([pa.width, pa.height], [pb.width, pb.height]);
  const rows = new Set<number>();
  const stride = pa.width * 3;
  for (let i = 0; i < pa.rgb.length; i++) if (pa.rgb[i] !== pb.rgb[i]) rows.add(Math.floor(i / stride / 16));
  return [...rows].sort((x, y) => x - y);
}

describe('QmpScreen on a bare OVMF machine (UEFI shell)', { skip, timeout: 120_000 }, () => {
  let dir: string;
  let qemu: ChildProcess | undefined;
  let qmp: QmpClient;
  let screen: QmpScreen;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-screen-'));
    qemu = spawn(
      QEMU,
      [
        '-M',
        'q35',
        '-nodefaults',
        '-m',
        '256',
        '-drive',
        `if=pflash,format=raw,readonly=on,file=${OVMF}`,
        '-vga',
        'std',
        '-display',
        'none',
        '-device',
        'qemu-xhci',
        '-device',
        'usb-tablet',
        '-net',
        'none',
        '-vnc',
        `unix:${dir}/vnc.sock`,
        '-qmp',
        `unix:${dir}/qmp.sock,server=on,wait=off`,
      ],
      { stdio: 'ignore' },
    );
    for (let i = 0; i < 100 && !existsSync(`${dir}/qmp.sock`); i++) await sleep(100);
    qmp = await QmpClient.connect(`${dir}/qmp.sock`);
    screen = new QmpScreen({ qmp: () => qmp, dumpDir: dir, vncSocket: `${dir}/vnc.sock` });
    // The shell is up once a still screen changes when a key is typed (and changes back on
    // backspace). Only letters before that: Escape at the firmware's logo opens its setup.
    const deadline = Date.now() + 90_000;
    for (;;) {
      assert.ok(Date.now() < deadline, 'the UEFI shell did not come up in 90 s');
      await sleep(1000);
      const a = Buffer.from((await screen.capture()).png);
      await sleep(1000);
      const b = Buffer.from((await screen.capture()).png);
      if (!a.equals(b) || !decodePng(b).rgb.some((v) => v > 0)) continue;
      await screen.input([{ action: 'type', text: 'x' }]);
      await sleep(500);
      const c = Buffer.from((await screen.capture()).png);
      if (c.equals(b)) continue;
      await screen.input([{ action: 'key', keys: 'BackSpace' }]);
      await sleep(500);
      if (Buffer.from((await screen.capture()).png).equals(b)) break;
    }
  });

  after(async () => {
    qmp?.close();
    if (qemu && qemu.exitCode === null) {
      const gone = new Promise((r) => qemu!.once('exit', r));
      qemu.kill('SIGKILL');
      await gone;
    }
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('captures a PNG of the screen size and leaves no file behind', async () => {
    const shot = await screen.capture();
    assert.deepEqual([shot.width, shot.height], [decodePng(shot.png).width, decodePng(shot.png).height]);
    assert.ok(shot.width >= 640 && shot.height >= 480, `${shot.width}x${shot.height}`);
    assert.deepEqual(
      (await readdir(dir)).filter((f) => f.endsWith('.png')),
      [],
    );
  });

  it('typed text and keys appear on the screen, in the rows of the prompt', async () => {
    const before = (await screen.capture()).png;
    const r = await screen.input([
      { action: 'type', text: 'echo Hi-There_42' },
      { action: 'key', keys: 'Return' },
      { action: 'wait', ms: 500 },
    ]);
    assert.equal(r.performed, 3);
    let after = before;
    for (let i = 0; i < 20 && Buffer.from(after).equals(Buffer.from(before)); i++) {
      await sleep(250);
      after = (await screen.capture()).png;
    }
    const rows = changedRows(before, after);
    assert.ok(rows.length > 0, 'typing changed nothing on the screen');
    // Text rows change, not the whole screen.
    assert.ok(rows.length < r.height / 16 / 2, `rows changed: ${rows.join(',')}`);
  });

  it('pointer actions inside the screen are performed', async () => {
    const { width, height } = await screen.capture();
    const actions: ScreenAction[] = parseOrThrow(ScreenActionsSchema, [
      { action: 'mouse_move', x: 10, y: 10 },
      { action: 'left_click', x: width - 1, y: height - 1 },
      { action: 'double_click', x: 5, y: 5 },
      { action: 'right_click', x: 5, y: 5 },
      { action: 'left_click_drag', from: { x: 1, y: 1 }, to: { x: 20, y: 20 } },
      { action: 'scroll', x: 5, y: 5, dy: 2, dx: -1 },
      { action: 'key', keys: 'ctrl+shift+Escape' },
    ]);
    const r = await screen.input(actions);
    assert.deepEqual(r, { performed: actions.length, width, height });
  });

  it('a coordinate outside the screen is refused naming the field, and nothing is sent', async () => {
    const { width, height } = await screen.capture();
    await assert.rejects(
      screen.input([
        { action: 'type', text: 'zzz' },
        { action: 'left_click', x: width, y: 0 },
      ]),
      (err: DsecError) => err.code === 'INVALID_ARGUMENT' && err.details.field === 'actions.1.x',
    );
    await assert.rejects(
      screen.input([
        {
          action: 'drag',
          path: [
            { x: 0, y: 0 },
            { x: 0, y: height + 3 },
          ],
        },
      ]),
      (err: DsecError) => err.code === 'INVALID_ARGUMENT' && err.details.field === 'actions.0.path.1.y',
    );
  });

  it('the VNC socket speaks RFB 3.8 and its server init has the screen size', async () => {
    const { width, height } = await screen.capture();
    const stream = socketStream(await screen.connectVnc());
    const it = stream[Symbol.asyncIterator]();
    let buf = Buffer.alloc(0);
    const need = async (n: number): Promise<Buffer> => {
      while (buf.length < n) {
        const r = await it.next();
        assert.ok(!r.done, 'the VNC server closed');
        if (r.value.kind === 'data') buf = Buffer.concat([buf, Buffer.from(r.value.data)]);
      }
      const out = buf.subarray(0, n);
      buf = buf.subarray(n);
      return out;
    };
    assert.match((await need(12)).toString('latin1'), /^RFB 003\.00\d\n$/);
    await stream.write('RFB 003.008\n');
    const count = (await need(1))[0]!;
    const types = [...(await need(count))];
    assert.ok(types.includes(1), `security types ${types.join(',')} offer None`);
    await stream.write(Buffer.from([1]));
    assert.equal((await need(4)).readUInt32BE(0), 0, 'security result OK');
    await stream.write(Buffer.from([1])); // shared
    const init = await need(24);
    assert.deepEqual([init.readUInt16BE(0), init.readUInt16BE(2)], [width, height]);
    await stream.detach();
    const exit = await stream.exited;
    assert.equal(exit.exitCode, 0);
  });

  it('key names and characters without a key are refused by the schema, naming the field', () => {
    assert.throws(
      () =>
        parseOrThrow(
          ScreenActionsSchema,
          [
            { action: 'type', text: 'ok' },
            { action: 'type', text: 'naïve' },
          ],
          'actions',
        ),
      (err: DsecError) => err.details.field === 'actions.1.text' && /character 2/.test(err.message),
    );
    assert.throws(
      () => parseOrThrow(ScreenActionsSchema, [{ action: 'key', keys: 'ctrl+nokey' }], 'actions'),
      (err: DsecError) => err.details.field === 'actions.0.keys',
    );
    assert.throws(
      () => parseOrThrow(ScreenActionsSchema, [{ action: 'left_click', x: -1, y: 0 }], 'actions'),
      (err: DsecError) => err.details.field === 'actions.0.x',
    );
  });
});
