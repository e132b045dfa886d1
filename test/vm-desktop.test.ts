// The screen of a VM end to end through the API, the SDK and the edge wire: one TCG boot of the
// `dsec image build --vm` image (cached machine-wide, shared with test/vm.test.ts) carries every
// check. Screenshots are PNGs of the screen's size; input is taken; pause keeps the screen and
// refuses input; bad actions are refused naming the field; the live view speaks RFB over a
// ticketed WebSocket and is refused without a ticket.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import WebSocket from 'ws';
import { DEFAULT_GUEST_CACHE, decodePng, diffPixels as screenDiff, prepareGuest, probeAccel } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall } from './helpers/assert.js';
import { AGENT_BINARY } from './helpers/node.js';

let tp: TestPlatform;
let client: DsecClient;
let sb: Sandbox;

/** Number of pixels that differ between two screenshots of one size. */
function diffPixels(a: Uint8Array, b: Uint8Array): number {
  return screenDiff(a, b).outside;
}

/** Opens the live view: resolves with the first bytes after the RFB handshake, or the refusal's status. */
function rfb(id: string, protocols: string[]): Promise<{ version?: string; width?: number; height?: number; status?: number }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${tp.url.replace('http', 'ws')}/v1/sandboxes/${id}/vnc`, protocols);
    let buf = Buffer.alloc(0);
    let step = 0;
    let version = '';
    ws.on('message', (m: Buffer) => {
      buf = Buffer.concat([buf, m]);
      if (step === 0 && buf.length >= 12) {
        version = buf.subarray(0, 12).toString('latin1');
        buf = buf.subarray(12);
        ws.send(Buffer.from('RFB 003.008\n'));
        step = 1;
      }
      if (step === 1 && buf.length >= 1 && buf.length >= 1 + buf[0]!) {
        assert.ok([...buf.subarray(1, 1 + buf[0]!)].includes(1), 'security type None offered');
        buf = buf.subarray(1 + buf[0]!);
        ws.send(Buffer.from([1]));
        step = 2;
      }
      if (step === 2 && buf.length >= 4) {
        assert.equal(buf.readUInt32BE(0), 0, 'security result OK');
        buf = buf.subarray(4);
        ws.send(Buffer.from([1]));
        step = 3;
      }
      if (step === 3 && buf.length >= 24) {
        resolve({ version, width: buf.readUInt16BE(0), height: buf.readUInt16BE(2) });
        ws.close();
      }
    });
    ws.on('unexpected-response', (_req, res) => resolve({ status: res.statusCode! }));
    ws.on('error', reject);
  });
}

before(async () => {
  tp = await startTestPlatform({ vm: {} });
  client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 600_000 });
  // The image test/vm.test.ts uses (same inputs: cached machine-wide, built once with progress).
  await client.layers.buildVm({ name: 'vm-screen' }, { onProgress: (line) => process.stderr.write(`vm image: ${line}\n`) });
  sb = await Sandbox.create({ backend: 'vm', image: { base: 'vm-screen' }, resources: { cpu: 1, memoryMiB: 512, diskMiB: 2048 } }, { client });
});
after(async () => {
  await sb?.kill().catch(() => undefined);
  await client?.close();
  await tp?.close();
});

describe('the screen of a VM', () => {
  test("the node's accelerator is the microVM boot probe's verdict", async () => {
    // The vm backend ran (or read the cached verdict of) the probe when the node opened: asked
    // again, the probe answers from its cache, and the node reports the same accelerator.
    const guest = await prepareGuest({ cacheDir: DEFAULT_GUEST_CACHE, agentBinary: AGENT_BINARY });
    const probe = await probeAccel({
      qemu: 'qemu-system-x86_64',
      guest,
      cacheDir: DEFAULT_GUEST_CACHE,
      tscHelper: path.join(path.dirname(AGENT_BINARY), 'dsec-tsckhz'),
      timeoutMs: 120_000,
    });
    assert.equal(probe.cached, true, 'the probe ran when the node opened');
    assert.equal(tp.platform.edge.capacity().vm?.accel, probe.accel);
  });

  test('screenshot, input, pause keeps the screen, bad actions, live view', async () => {
    // A screenshot is a PNG of the size the headers give.
    const first = await sb.screen.capture();
    const px = decodePng(first.png);
    assert.deepEqual([px.width, px.height], [first.width, first.height]);
    assert.ok(first.width >= 640 && first.height >= 400, `${first.width}x${first.height}`);

    // Keys and text are taken (the image's cloud kernel has no framebuffer console, so nothing
    // echoes them on this screen: text appearing is checked against the UEFI shell in
    // packages/edge/src/backends/qemu/screen.test.ts).
    const typed = await sb.screen.actions([
      { action: 'type', text: 'Hello, VM! 42' },
      { action: 'key', keys: 'Return' },
    ]);
    assert.deepEqual(typed, { performed: 2, width: first.width, height: first.height });
    const after = (await sb.screen.capture()).png;
    // A click round trip: the actions are taken (the console has no pointer to draw).
    assert.equal((await sb.screen.click(first.width - 1, first.height - 1)).performed, 1);
    assert.equal(
      (
        await sb.screen.actions([
          {
            action: 'drag',
            path: [
              { x: 1, y: 1 },
              { x: 30, y: 40 },
            ],
          },
          { action: 'scroll', x: 5, y: 5, dy: 1, dx: 0 },
        ])
      ).performed,
      2,
    );

    // Pause keeps the screen: a paused VM is shown as it was, and the text is still there after resume.
    await sb.pause();
    const paused = (await sb.screen.capture()).png;
    assert.ok(diffPixels(after, paused) < 400, `the paused screen is the screen before the pause`);
    assert.equal((await sb.info()).state, 'paused', 'looking at the screen does not resume it');
    // Input is activity: the default lease (autoResume) resumes the VM first, then types.
    const resumed = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/input`, { actions: [{ action: 'key', keys: 'shift' }] });
    assert.equal(resumed.status, 200, JSON.stringify(resumed.body));
    assert.equal((await sb.info()).state, 'running');
    assert.ok(diffPixels(after, (await sb.screen.capture()).png) < 400, 'the text is still there after resume');

    // Bad actions: 400 naming the field; nothing is typed.
    const bad = async (actions: unknown, field: string): Promise<void> => {
      const r = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/input`, { actions });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error.field, field, JSON.stringify(r.body));
    };
    await bad([{ action: 'left_click', x: first.width, y: 0 }], 'actions.0.x');
    await bad(
      [
        { action: 'type', text: 'ok' },
        { action: 'left_click_drag', from: { x: 0, y: 0 }, to: { x: 0, y: first.height } },
      ],
      'actions.1.to.y',
    );
    await bad([{ action: 'type', text: 'naïve' }], 'actions.0.text');
    await bad([{ action: 'key', keys: 'ctrl+nokey' }], 'actions.0.keys');
    await bad([{ action: 'teleport', x: 1, y: 1 }], 'actions.0.action');
    await bad([], 'actions');

    // The live view: RFB over a WebSocket opened with a single-use ticket; without one, refused.
    const t = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/ws-tickets');
    assert.equal(t.status, 201);
    const view = await rfb(sb.id, ['dsec.v1', `dsec.ticket.${t.body.ticket}`]);
    assert.match(view.version ?? '', /^RFB 003\.00\d\n$/);
    assert.deepEqual([view.width, view.height], [first.width, first.height]);
    assert.equal((await rfb(sb.id, ['dsec.v1', `dsec.ticket.${t.body.ticket}`])).status, 401, 'a ticket is single-use');
    assert.equal((await rfb(sb.id, ['dsec.v1'])).status, 401, 'no ticket, no view');

    // Watching is not activity: the live view of a paused VM shows it without resuming it.
    await sb.pause();
    const t2 = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/ws-tickets');
    const pausedView = await rfb(sb.id, ['dsec.v1', `dsec.ticket.${t2.body.ticket}`]);
    assert.deepEqual([pausedView.width, pausedView.height], [first.width, first.height]);
    assert.equal((await sb.info()).state, 'paused', 'the live view does not resume a paused VM');
    await sb.resume();
  });

  test("the dashboard's screen tab draws the VM's screen over RFB", async () => {
    const CHROMIUM = '/usr/bin/chromium';
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} (Debian's chromium package) is needed`);
    const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'], timeout: 30_000 });
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
      const problems: string[] = [];
      page.on('console', (m) => {
        if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(m.text());
      });
      page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
      await page.goto(`${tp.url}/ui/`);
      await page.getByTestId('key').fill(tp.adminKey);
      await page.getByTestId('sign-in').click();
      await page.getByTestId('whoami').waitFor();
      await page.goto(`${tp.url}/ui/#/sandbox/${sb.id}/screen`);
      const shot = await sb.screen.capture();
      await page
        .getByTestId('screen-status')
        .filter({ hasText: `connected ${shot.width}×${shot.height}` })
        .waitFor({ timeout: 20_000 });
      // The canvas shows the screen's pixels (the still console): compare a grid of them with a screenshot.
      const ref = decodePng(shot.png);
      const STEP = 11;
      const sample = async (): Promise<number> => {
        // Sampled in the page: only every STEP-th pixel of every STEP-th row crosses back (RGBA).
        const canvas = await page.evaluate<number[]>(`(() => {
          const c = document.querySelector('[data-testid=screen]');
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          const out = [];
          for (let y = 0; y < c.height; y += ${STEP}) for (let x = 0; x < c.width; x += ${STEP}) { const i = (y * c.width + x) * 4; out.push(d[i], d[i + 1], d[i + 2], d[i + 3]); }
          return out;
        })()`);
        let differ = 0;
        let k = 0;
        for (let y = 0; y < shot.height; y += STEP)
          for (let x = 0; x < shot.width; x += STEP, k += 4) {
            const i = (y * shot.width + x) * 3;
            // Alpha 255: drawn by the client (a canvas nobody drew on is transparent black).
            if (canvas[k] !== ref.rgb[i] || canvas[k + 1] !== ref.rgb[i + 1] || canvas[k + 2] !== ref.rgb[i + 2] || canvas[k + 3] !== 255) differ++;
          }
        return differ;
      };
      let differ = Infinity;
      for (let i = 0; i < 40 && differ > 50; i++) {
        await page.waitForTimeout(250);
        differ = await sample();
      }
      assert.ok(differ <= 50, `${differ} sampled pixels of the canvas differ from the screenshot`);
      if (process.env['DSEC_UPDATE_SCREENSHOTS'] === '1')
        await page.screenshot({ path: new URL('../../docs/img/dashboard-vm-screen.png', import.meta.url).pathname });
      // Clicks and keys on the canvas go to the VM (nothing on this console shows them) without errors.
      await page.getByTestId('screen').click({ position: { x: 10, y: 10 } });
      await page.keyboard.press('a');
      await page.waitForTimeout(300);
      assert.deepEqual(problems, []);
    } finally {
      await browser.close();
    }
  });

  test('a sandbox without a screen: 409 naming why', async () => {
    const c = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/sandboxes', { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } });
    assert.equal(c.status, 201, JSON.stringify(c.body));
    try {
      const r = await apiCall(tp.url, tp.adminKey, 'GET', `/v1/sandboxes/${c.body.id}/screen`);
      assert.equal(r.status, 409);
      assert.match(r.body.error.message, /backend container/);
    } finally {
      await fetch(`${tp.url}/v1/sandboxes/${c.body.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${tp.adminKey}` } });
    }
  });
});
