// The desktop image (`dsec image build --vm --desktop`) end to end, under `npm run test:long`
// (DSEC_LONG=1): its build takes minutes from an empty cache and its boot (OVMF, the generic
// kernel with an initramfs, systemd, Xorg) tens of seconds under TCG. One boot carries every
// check: the screen shows the desktop (twm's background, an xterm); text typed through the API
// appears in the xterm on the screen, and the command it typed ran (its file is read through
// exec); a pause with the memory in a file ends QEMU, its screenshot is the last screen, and the
// resumed VM shows the same screen and takes input again; the desktop's browser (chromium),
// started from the xterm, shows a page this test serves. `npm test` keeps the cheaper checks
// (test/vm.test.ts: an NVMe VM refuses a pause to a file naming `memory`;
// packages/edge/src/backends/vm/qemu.test.ts: the disk bus).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { countPixels, desktopShown, DESKTOP_XTERM as XTERM, diffPixels, focusXterm, isBlack, pollUntil } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const LONG = process.env.DSEC_LONG === '1';
/** How long the desktop may take to show its xterm after create (TCG on a loaded machine). */
const DESKTOP_MS = 240_000;
/** How long typed text may take to run (the command writes a file). */
const TYPED_MS = 60_000;
/** How long the browser may take to start and draw the page (chromium under TCG). */
const BROWSER_MS = 300_000;

/** A loopback address of this run's own for the page the browser opens (the VM's policy allows only it). */
const PAGE_ADDRESS = `127.${1 + ((randomBytes(1)[0] ?? 0) % 250)}.${randomBytes(1)[0] ?? 0}.2`;
/** The page: a magenta background over the whole window (seen in a screenshot without reading text). */
const PAGE =
  '<!doctype html><html><head><title>dsec page</title></head><body style="margin:0;background:#ff00ff;height:100vh"><h1>dsec page</h1></body></html>';
const magenta = (r: number, g: number, b: number): boolean => r > 230 && g < 40 && b > 230;

/** `user comm` of the guest's processes named here (minbase has no procps). */
const PS = (names: string): string[] => [
  'sh',
  '-c',
  `for d in /proc/[0-9]*; do c=$(cat $d/comm 2>/dev/null); case "$c" in ${names}) echo "$(stat -c %U $d) $c";; esac; done`,
];

let tp: TestPlatform;
let client: DsecClient;
let sb: Sandbox | undefined;
let pageServer: http.Server | undefined;
/** Requests the page server answered. */
let pageRequests = 0;

describe('the desktop image', { skip: LONG ? false : 'DSEC_LONG=1 (npm run test:long): builds and boots the desktop image' }, () => {
  before(async () => {
    pageServer = http.createServer((_req, res) => {
      pageRequests++;
      res.setHeader('content-type', 'text/html');
      res.end(PAGE);
    });
    await new Promise<void>((resolve) => pageServer!.listen(80, PAGE_ADDRESS, resolve));
    tp = await startTestPlatform({
      vm: {},
      network: { hosts: { 'page.test': PAGE_ADDRESS }, nameservers: [], allowedPrivateRanges: [`${PAGE_ADDRESS}/32`] },
    });
    client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 900_000 });
  });
  after(async () => {
    await sb?.kill().catch(() => undefined);
    await client?.close();
    await tp?.close();
    if (pageServer) await new Promise((resolve) => pageServer!.close(resolve));
  });

  test('typed text appears in the xterm and runs; pause to a file keeps the screen; the browser shows a page', async () => {
    // Built once machine-wide (minutes, with progress), then cached by its inputs.
    const layer = await client.layers.buildVm({ name: 'desktop', desktop: true }, { onProgress: (line) => process.stderr.write(`desktop image: ${line}\n`) });
    assert.equal(layer.kind, 'disk');
    const labels = (await tp.platform.edge.layers.resolve(layer.digest)).labels;
    assert.equal(labels['dsec.vm.disk'], 'virtio-blk', 'the root on virtio-blk');
    assert.equal(labels['dsec.vm.desktop'], 'x11');

    const t0 = Date.now();
    sb = await Sandbox.create(
      {
        backend: 'vm',
        image: { base: 'desktop' },
        // The browser needs more than the xterm's 512 MiB.
        resources: { cpu: 1, memoryMiB: 1024, diskMiB: 3072 },
        network: { mode: 'allowlist', allow: [{ host: 'page.test' }] },
      },
      { client },
    );
    const booted = Date.now() - t0;
    // The generic kernel drives the VGA through bochs-drm; X runs as the logged-in user.
    assert.match((await sb.exec(['uname', '-r'])).stdout, /^\d[\d.]*-\d+-amd64\n$/, 'the generic kernel');
    assert.equal((await sb.exec(['sh', '-c', 'test -e /dev/dri/card0 && lsmod | grep -c ^bochs'])).stdout.trim(), '1', 'bochs-drm loaded');
    assert.match((await sb.exec(['sh', '-c', 'readlink /sys/block/vda/device/driver'])).stdout, /virtio_blk/, 'the root disk is virtio-blk');

    // The desktop: the xterm's white window at its place, twm's background around it.
    const desktop = await pollUntil('the xterm on the screen', DESKTOP_MS, async () => {
      const ps = await sb!.exec(PS('xterm|twm'));
      if (!/user xterm/.test(ps.stdout) || !/user twm/.test(ps.stdout)) return undefined;
      return desktopShown(sb!);
    });
    const shown = Date.now() - t0;
    assert.ok(desktop.width >= 800 && desktop.height >= 600, `${desktop.width}x${desktop.height}`);
    const outsideRect = { x: XTERM.x + XTERM.w + 40, y: 0, w: desktop.width - (XTERM.x + XTERM.w + 40), h: desktop.height };
    assert.ok(
      countPixels(desktop.png, outsideRect, (r, g, b) => r > 240 && g > 240 && b > 240) < outsideRect.w * outsideRect.h * 0.01,
      'the background beside the xterm is not white',
    );
    const ps = (await sb.exec(PS('Xorg|xterm'))).stdout;
    assert.match(ps, /user xterm/, 'the session runs as the logged-in user');
    assert.match(ps, /Xorg/, 'X runs');

    // Typed through the API: the pointer moves into the xterm (twm's focus follows it) and a
    // command is typed until it runs (keys sent before X took the click are lost); then the
    // measured command: it runs in the xterm's shell (its file is read back) and its characters
    // are drawn: black pixels appear in the xterm and nothing changes outside it.
    await focusXterm(sb, '/tmp/focus.txt', TYPED_MS * 2).catch(async (err: unknown) => {
      // What the guest saw: its input devices and X's log (the failure's message carries them).
      const seen = await sb!.exec(['sh', '-c', 'cat /proc/bus/input/devices; tail -40 /home/user/.local/share/xorg/Xorg.0.log /var/log/Xorg.0.log 2>&1']);
      throw new Error(`${String(err)}\n${seen.stdout}`);
    });
    const focused = await pollUntil('the focus command drawn and steady', TYPED_MS, async () => {
      const a = await sb!.screen.capture();
      await new Promise((r) => setTimeout(r, 500));
      const b = await sb!.screen.capture();
      const d = diffPixels(a.png, b.png);
      return d.outside === 0 ? b : undefined;
    });
    const blackBefore = countPixels(focused.png, XTERM, isBlack);
    const typed = await sb.screen.actions([
      { action: 'type', text: 'echo typed-$((6*7)) > /tmp/typed.txt' },
      { action: 'key', keys: 'Return' },
    ]);
    assert.equal(typed.performed, 2);
    const content = await pollUntil('the typed command ran', TYPED_MS, async () => {
      const r = await sb!.exec(['cat', '/tmp/typed.txt']);
      return r.exitCode === 0 && r.stdout.length > 0 ? r.stdout : undefined;
    });
    assert.equal(content, 'typed-42\n', 'the shell in the xterm ran the typed command');
    assert.equal((await sb.exec(['stat', '-c', '%U', '/tmp/typed.txt'])).stdout.trim(), 'user');
    const afterTyping = await pollUntil('the typed text drawn', TYPED_MS, async () => {
      const shot = await sb!.screen.capture();
      // `echo typed-$((6*7)) > /tmp/typed.txt`: ~35 characters of 6x13 glyphs, ~20 black pixels each.
      return countPixels(shot.png, XTERM, isBlack) - blackBefore > 300 ? shot : undefined;
    });
    const changed = diffPixels(desktop.png, afterTyping.png, XTERM);
    assert.ok(changed.inside > 300, `pixels changed in the xterm: ${changed.inside}`);
    assert.ok(changed.outside < 50, `pixels changed outside the xterm: ${changed.outside}`);

    // Pause with the memory in a file: QEMU ends, and the screen is the last one it showed;
    // resumed, the screen is the same and input works.
    const stateFile = path.join(tp.platform.edge.home, 'vm', sb.id, 'memory.state');
    const beforePause = (await sb.screen.capture()).png;
    const paused = await sb.pause({ memory: 'file' });
    assert.ok(paused.memoryAfterBytes < paused.memoryBeforeBytes / 4, `memory ${paused.memoryBeforeBytes} -> ${paused.memoryAfterBytes}`);
    assert.ok(existsSync(stateFile), `${stateFile} written`);
    assert.equal((await sb.info()).state, 'paused');
    const whilePaused = await sb.screen.capture();
    const last = diffPixels(beforePause, whilePaused.png);
    assert.ok(last.outside < 50, `the screenshot of a VM paused to a file is its last screen (${last.outside} pixels differ)`);
    assert.equal((await sb.info()).state, 'paused', 'looking at the screen does not resume it');
    const tr = Date.now();
    await sb.resume();
    const resumeMs = Date.now() - tr;
    assert.ok(!existsSync(stateFile), 'the state file is removed once resumed');
    const afterResume = (await sb.screen.capture()).png;
    const kept = diffPixels(beforePause, afterResume, XTERM);
    assert.ok(kept.inside + kept.outside < 50, `the screen after resume is the screen before the pause (${kept.inside + kept.outside} pixels differ)`);
    assert.equal((await sb.exec(['cat', '/tmp/typed.txt'])).stdout, 'typed-42\n');
    await sb.screen.actions([
      { action: 'type', text: 'echo again > /tmp/again.txt' },
      { action: 'key', keys: 'Return' },
    ]);
    const again = await pollUntil('typed after the resume', TYPED_MS, async () => {
      const r = await sb!.exec(['cat', '/tmp/again.txt']);
      return r.exitCode === 0 && r.stdout.length > 0 ? r.stdout : undefined;
    });
    assert.equal(again, 'again\n');

    // The browser: started from the xterm as an agent would, it fetches the page through the
    // VM's network policy and draws it (its magenta background fills a large part of the screen).
    const tb = Date.now();
    await sb.screen.actions([
      { action: 'type', text: 'browser http://page.test/ > /tmp/browser.log 2>&1 &' },
      { action: 'key', keys: 'Return' },
    ]);
    const page = await pollUntil(
      'the page drawn by the browser',
      BROWSER_MS,
      async () => {
        const shot = await sb!.screen.capture();
        return countPixels(shot.png, { x: 0, y: 0, w: shot.width, h: shot.height }, magenta) > 200 * 200 ? shot : undefined;
      },
      2000,
    ).catch(async (err: unknown) => {
      const seen = await sb!.exec(['sh', '-c', 'tail -30 /tmp/browser.log; free -m']);
      throw new Error(`${String(err)} (page requests: ${pageRequests})\n${seen.stdout}`);
    });
    const browserMs = Date.now() - tb;
    assert.ok(pageRequests >= 1, "the page came from this test's server");
    assert.match((await sb.exec(PS('chromium'))).stdout, /user chromium/, 'the browser runs as the logged-in user');
    assert.ok(diffPixels(afterResume, page.png).outside > 200 * 200, 'the screen changed');

    // A fork with memory of the running desktop: the fork shows the page the browser drew (its
    // memory came with it), its guest took an address of its own, and the two diverge.
    const tf = Date.now();
    const twin = (await sb.fork(1, { memory: true })).sandboxes[0]!;
    const forkMs = Date.now() - tf;
    try {
      const addr = async (s: Sandbox): Promise<string> => (await s.exec(['sh', '-c', "ip -4 -o addr show scope global | awk '{print $4}'"])).stdout;
      assert.notEqual(await addr(twin), await addr(sb), 'the fork has an address of its own');
      assert.match((await twin.exec(PS('chromium'))).stdout, /user chromium/, "the source's browser runs on in the fork");
      const shot = await twin.screen.capture();
      assert.ok(countPixels(shot.png, { x: 0, y: 0, w: shot.width, h: shot.height }, magenta) > 200 * 200, "the fork shows the source's page");
      await twin.exec(['sh', '-c', 'echo fork > /tmp/typed.txt']);
      assert.equal((await sb.exec(['cat', '/tmp/typed.txt'])).stdout, 'typed-42\n', 'the two diverge');
    } finally {
      await twin.kill().catch(() => undefined);
    }
    process.stderr.write(
      `desktop: create ${booted} ms, xterm on screen ${shown} ms after create began, resume from file ${resumeMs} ms, browser to the page ${browserMs} ms, fork with memory ${forkMs} ms\n`,
    );
  });
});
