// The desktop image (`dsec image build --vm --desktop`) end to end, under `npm run test:long`
// (DSEC_LONG=1): its build takes minutes from an empty cache and its boot (OVMF, the generic
// kernel with an initramfs, systemd, Xorg) tens of seconds under TCG. One boot carries every
// check: the screen shows the desktop (twm's background, an xterm); text typed through the API
// appears in the xterm on the screen, and the command it typed ran (its file is read through
// exec); a pause with the memory in a file ends QEMU, and the resumed VM shows the same screen and
// takes input again. `npm test` keeps the cheaper checks (test/vm.test.ts: an NVMe VM refuses a
// pause to a file naming `memory`; packages/edge/src/backends/vm/qemu.test.ts: the disk bus).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { decodePng } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const LONG = process.env.DSEC_LONG === '1';
/** How long the desktop may take to show its xterm after create (TCG on a loaded machine). */
const DESKTOP_MS = 240_000;
/** How long typed text may take to run (the command writes a file). */
const TYPED_MS = 60_000;
/** xterm's place on the screen (the image's xinitrc: `-geometry 100x32+16+16`, 6x13 `fixed`). */
const XTERM = { x: 16, y: 16, w: 600, h: 416 };

/** `user comm` of the guest's processes named here (minbase has no procps). */
const PS = (names: string): string[] => [
  'sh',
  '-c',
  `for d in /proc/[0-9]*; do c=$(cat $d/comm 2>/dev/null); case "$c" in ${names}) echo "$(stat -c %U $d) $c";; esac; done`,
];

let tp: TestPlatform;
let client: DsecClient;
let sb: Sandbox | undefined;

/** Pixels of colour (r, g, b) inside a rectangle. */
function count(png: Buffer, rect: { x: number; y: number; w: number; h: number }, rgbOf: (r: number, g: number, b: number) => boolean): number {
  const { width, rgb } = decodePng(png);
  let n = 0;
  for (let y = rect.y; y < rect.y + rect.h; y++)
    for (let x = rect.x; x < rect.x + rect.w; x++) {
      const i = (y * width + x) * 3;
      if (rgbOf(rgb[i]!, rgb[i + 1]!, rgb[i + 2]!)) n++;
    }
  return n;
}

/** Differing pixels of two screenshots of one size, inside and outside a rectangle. */
function diff(a: Buffer, b: Buffer, rect: { x: number; y: number; w: number; h: number }): { inside: number; outside: number } {
  const pa = decodePng(a);
  const pb = decodePng(b);
  assert.deepEqual([pa.width, pa.height], [pb.width, pb.height], 'same screen size');
  let inside = 0;
  let outside = 0;
  for (let y = 0; y < pa.height; y++)
    for (let x = 0; x < pa.width; x++) {
      const i = (y * pa.width + x) * 3;
      if (pa.rgb[i] === pb.rgb[i] && pa.rgb[i + 1] === pb.rgb[i + 1] && pa.rgb[i + 2] === pb.rgb[i + 2]) continue;
      if (x >= rect.x && x < rect.x + rect.w && y >= rect.y && y < rect.y + rect.h) inside++;
      else outside++;
    }
  return { inside, outside };
}

const white = (r: number, g: number, b: number): boolean => r > 240 && g > 240 && b > 240;
const black = (r: number, g: number, b: number): boolean => r < 16 && g < 16 && b < 16;

/** Polls `probe` until it returns a value (not undefined) or `ms` pass. */
async function until<T>(what: string, ms: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`${what}: not within ${ms} ms${last ? ` (last error: ${last instanceof Error ? last.message : JSON.stringify(last)})` : ''}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

describe('the desktop image', { skip: LONG ? false : 'DSEC_LONG=1 (npm run test:long): builds and boots the desktop image' }, () => {
  before(async () => {
    tp = await startTestPlatform({ vm: {} });
    client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 900_000 });
  });
  after(async () => {
    await sb?.kill().catch(() => undefined);
    await client?.close();
    await tp?.close();
  });

  test('typed text appears in the xterm and runs; pause to a file keeps the screen', async () => {
    // Built once machine-wide (minutes, with progress), then cached by its inputs.
    const layer = await client.layers.buildVm({ name: 'desktop', desktop: true }, { onProgress: (line) => process.stderr.write(`desktop image: ${line}\n`) });
    assert.equal(layer.kind, 'disk');
    const labels = (await tp.platform.edge.layers.resolve(layer.digest)).labels;
    assert.equal(labels['dsec.vm.disk'], 'virtio-blk', 'the root on virtio-blk');
    assert.equal(labels['dsec.vm.desktop'], 'x11');

    const t0 = Date.now();
    sb = await Sandbox.create({ backend: 'vm', image: { base: 'desktop' }, resources: { cpu: 1, memoryMiB: 512, diskMiB: 2048 } }, { client });
    const booted = Date.now() - t0;
    // The generic kernel drives the VGA through bochs-drm; X runs as the logged-in user.
    assert.match((await sb.exec(['uname', '-r'])).stdout, /^\d[\d.]*-\d+-amd64\n$/, 'the generic kernel');
    assert.equal((await sb.exec(['sh', '-c', 'test -e /dev/dri/card0 && lsmod | grep -c ^bochs'])).stdout.trim(), '1', 'bochs-drm loaded');
    assert.match((await sb.exec(['sh', '-c', 'readlink /sys/block/vda/device/driver'])).stdout, /virtio_blk/, 'the root disk is virtio-blk');

    // The desktop: the xterm's white window at its place, twm's background around it.
    const desktop = await until('the xterm on the screen', DESKTOP_MS, async () => {
      const ps = await sb!.exec(PS('xterm|twm'));
      if (!/user xterm/.test(ps.stdout) || !/user twm/.test(ps.stdout)) return undefined;
      // The window white and its prompt drawn (dark glyphs, the same in two screenshots a second apart).
      const shot = await sb!.screen.capture();
      const inXterm = count(shot.png, { x: XTERM.x + 8, y: XTERM.y + 40, w: XTERM.w - 16, h: XTERM.h - 60 }, white);
      const prompt = count(shot.png, XTERM, black);
      if (inXterm < (XTERM.w - 16) * (XTERM.h - 60) * 0.9 || prompt < 100) return undefined;
      await new Promise((r) => setTimeout(r, 1000));
      const again = await sb!.screen.capture();
      return count(again.png, XTERM, black) === prompt ? again : undefined;
    });
    const shown = Date.now() - t0;
    assert.ok(desktop.width >= 800 && desktop.height >= 600, `${desktop.width}x${desktop.height}`);
    const outsideRect = { x: XTERM.x + XTERM.w + 40, y: 0, w: desktop.width - (XTERM.x + XTERM.w + 40), h: desktop.height };
    assert.ok(count(desktop.png, outsideRect, white) < outsideRect.w * outsideRect.h * 0.01, 'the background beside the xterm is not white');
    const ps = (await sb.exec(PS('Xorg|xterm'))).stdout;
    assert.match(ps, /user xterm/, 'the session runs as the logged-in user');
    assert.match(ps, /Xorg/, 'X runs');

    // Typed through the API: the pointer moves into the xterm (twm's focus follows it), the text
    // is typed and Return pressed. The command runs in the xterm's shell (its file is read back)
    // and its characters are drawn: black pixels appear in the xterm and nothing changes outside it.
    // X takes the click (and the focus with it) some time after the request under TCG: keys sent
    // before go to the root window. xterm draws its cursor hollow without the focus and as a
    // filled block with it: the block shows when the focus is there.
    await sb.screen.click(XTERM.x + XTERM.w / 2, XTERM.y + XTERM.h / 2);
    const idle = count(desktop.png, XTERM, black);
    const blackBefore = await until('the xterm has the focus (its cursor filled)', TYPED_MS, async () => {
      const n = count((await sb!.screen.capture()).png, XTERM, black);
      return n > idle + 30 ? n : undefined;
    });
    const typed = await sb.screen.actions([
      { action: 'type', text: 'echo typed-$((6*7)) > /tmp/typed.txt' },
      { action: 'key', keys: 'Return' },
    ]);
    assert.equal(typed.performed, 2);
    const content = await until('the typed command ran', TYPED_MS, async () => {
      const r = await sb!.exec(['cat', '/tmp/typed.txt']);
      return r.exitCode === 0 && r.stdout.length > 0 ? r.stdout : undefined;
    }).catch(async (err: unknown) => {
      // What the guest saw: its input devices and X's log (the failure's message carries them).
      const seen = await sb!.exec(['sh', '-c', 'cat /proc/bus/input/devices; tail -40 /home/user/.local/share/xorg/Xorg.0.log /var/log/Xorg.0.log 2>&1']);
      throw new Error(`${String(err)}\n${seen.stdout}`);
    });
    assert.equal(content, 'typed-42\n', 'the shell in the xterm ran the typed command');
    assert.equal((await sb.exec(['stat', '-c', '%U', '/tmp/typed.txt'])).stdout.trim(), 'user');
    const afterTyping = await until('the typed text drawn', TYPED_MS, async () => {
      const shot = await sb!.screen.capture();
      // `echo typed-$((6*7)) > /tmp/typed.txt`: ~35 characters of 6x13 glyphs, ~20 black pixels each.
      return count(shot.png, XTERM, black) - blackBefore > 300 ? shot : undefined;
    });
    const changed = diff(desktop.png, afterTyping.png, XTERM);
    assert.ok(changed.inside > 300, `pixels changed in the xterm: ${changed.inside}`);
    assert.ok(changed.outside < 50, `pixels changed outside the xterm: ${changed.outside}`);

    // Pause with the memory in a file: QEMU ends; resumed, the screen is the same and input works.
    const stateFile = path.join(tp.platform.edge.home, 'vm', sb.id, 'memory.state');
    const beforePause = (await sb.screen.capture()).png;
    const paused = await sb.pause({ memory: 'file' });
    assert.ok(paused.memoryAfterBytes < paused.memoryBeforeBytes / 4, `memory ${paused.memoryBeforeBytes} -> ${paused.memoryAfterBytes}`);
    assert.ok(existsSync(stateFile), `${stateFile} written`);
    assert.equal((await sb.info()).state, 'paused');
    const tr = Date.now();
    await sb.resume();
    const resumeMs = Date.now() - tr;
    assert.ok(!existsSync(stateFile), 'the state file is removed once resumed');
    const afterResume = (await sb.screen.capture()).png;
    const kept = diff(beforePause, afterResume, XTERM);
    assert.ok(kept.inside + kept.outside < 50, `the screen after resume is the screen before the pause (${kept.inside + kept.outside} pixels differ)`);
    assert.equal((await sb.exec(['cat', '/tmp/typed.txt'])).stdout, 'typed-42\n');
    await sb.screen.actions([
      { action: 'type', text: 'echo again > /tmp/again.txt' },
      { action: 'key', keys: 'Return' },
    ]);
    const again = await until('typed after the resume', TYPED_MS, async () => {
      const r = await sb!.exec(['cat', '/tmp/again.txt']);
      return r.exitCode === 0 && r.stdout.length > 0 ? r.stdout : undefined;
    });
    assert.equal(again, 'again\n');
    process.stderr.write(`desktop: create ${booted} ms, xterm on screen ${shown} ms after create began, resume from file ${resumeMs} ms\n`);
  });
});
