// The dashboard (/ui) in a real headless Chromium (Debian's `chromium`, driven by playwright-core)
// against a real dsec: serving and its headers, sign-in, sandboxes made, paused and deleted through
// the API followed in the list from the event stream (no further read of the list), the terminal (xterm.js over the exec WebSocket, opened with a single-use
// ticket), upload and download, a network policy change, pause and resume followed live in the
// events stream, hostile labels and file names shown as text, the keys and audit pages following
// their answers (one request each) and ending with the reason when their key is revoked, and a
// viewer key that sees no mutating buttons (and whose calls the API refuses). DSEC_UPDATE_SCREENSHOTS=1 writes
// docs/img/dashboard-*.png.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { chromium } from 'playwright-core';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import WebSocket from 'ws';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { testProject } from './helpers/tenants.js';

const CHROMIUM = '/usr/bin/chromium';
const SCREENSHOTS = process.env.DSEC_UPDATE_SCREENSHOTS === '1';
const IMG_DIR = path.join(REPO_ROOT, 'docs', 'img');
/** A label value and a file name that would run script if they were ever taken as markup. */
const HOSTILE = '<img src=x onerror="window.__pwned=1">';

let platform: TestPlatform;
let browser: Browser | undefined;
let viewerKey: string;

async function call(method: string, route: string, key: string, json?: unknown, raw?: Uint8Array): Promise<{ status: number; body: any }> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  let body: string | Uint8Array | undefined = raw;
  if (json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const res = await fetch(platform.url + route, { method, headers, ...(body !== undefined ? { body } : {}) });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, body: parsed };
}

async function shot(page: Page, name: string): Promise<void> {
  if (!SCREENSHOTS) return;
  await mkdir(IMG_DIR, { recursive: true });
  await page.waitForTimeout(300);
  await page.screenshot({ path: path.join(IMG_DIR, `dashboard-${name}.png`) });
}

/** A browser context signed in with `key`; records CSP violations and page errors. */
async function signedIn(key: string): Promise<{ context: BrowserContext; page: Page; problems: string[] }> {
  const context = await browser!.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${platform.url}/ui/`);
  await page.getByTestId('key').fill(key);
  await page.getByTestId('sign-in').click();
  await page.getByTestId('whoami').waitFor();
  return { context, page, problems };
}

before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} (Debian's chromium package) is needed`);
  assert.ok(existsSync(path.join(REPO_ROOT, 'ui', 'dist', 'index.html')), 'the dashboard is built (node ui/build.mjs)');
  platform = await startTestPlatform();
  const k = await call('POST', '/v1/keys', platform.adminKey, { name: 'dash-viewer', role: 'viewer' });
  assert.equal(k.status, 201, JSON.stringify(k.body));
  viewerKey = k.body.key;
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'], timeout: 30_000 });
});

after(async () => {
  await browser?.close().catch(() => undefined);
  await platform?.close();
});

describe('dashboard', () => {
  test('/ui is served with its types, caching and a Content-Security-Policy without inline script', async () => {
    const redirect = await fetch(`${platform.url}/ui`, { redirect: 'manual' });
    assert.equal(redirect.status, 301);
    const page = await fetch(`${platform.url}/ui/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-type')!, /^text\/html/);
    assert.equal(page.headers.get('cache-control'), 'no-cache');
    const csp = page.headers.get('content-security-policy')!;
    assert.match(csp, /script-src 'self'(;|$)/);
    assert.doesNotMatch(csp, /unsafe-eval|script-src[^;]*unsafe-inline/);
    assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
    const html = await page.text();
    assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/, 'no inline script');
    const js = /src="(\/ui\/assets\/[^"]+\.js)"/.exec(html)![1]!;
    const asset = await fetch(platform.url + js);
    assert.equal(asset.status, 200);
    assert.match(asset.headers.get('content-type')!, /^text\/javascript/);
    assert.match(asset.headers.get('cache-control')!, /immutable/);
    assert.equal((await fetch(`${platform.url}/ui/assets/nope.js`)).status, 404);
    // Deep links are the page (the dashboard routes in the hash).
    assert.equal((await fetch(`${platform.url}/ui/sandboxes`)).status, 200);
  });

  test('a WebSocket ticket opens one exec session, once, and stays out of the audit', async () => {
    const sb = await call('POST', '/v1/sandboxes', platform.adminKey, { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    const t = await call('POST', '/v1/ws-tickets', platform.adminKey);
    assert.equal(t.status, 201);
    assert.ok(Date.parse(t.body.expiresAt) - Date.now() <= 30_000);
    const open = (ticket: string): Promise<{ out: string; status?: number }> =>
      new Promise((resolve, reject) => {
        const ws = new WebSocket(`${platform.url.replace('http', 'ws')}/v1/sandboxes/${sb.body.id}/exec/ws`, ['dsec.v1', `dsec.ticket.${ticket}`]);
        let out = '';
        ws.on('open', () => {
          assert.equal(ws.protocol, 'dsec.v1');
          ws.send(JSON.stringify({ cmd: 'echo ticket-ok' }));
        });
        ws.on('message', (m) => {
          const ev = JSON.parse((m as Buffer).toString());
          if (ev.type === 'output') out += Buffer.from(ev.data, 'base64').toString();
        });
        ws.on('close', () => resolve({ out }));
        ws.on('unexpected-response', (_req, res) => resolve({ out, status: res.statusCode! }));
        ws.on('error', reject);
      });
    assert.equal((await open(t.body.ticket)).out, 'ticket-ok\n');
    assert.equal((await open(t.body.ticket)).status, 401, 'a ticket is single-use');
    assert.equal((await open('made-up')).status, 401);
    // A viewer's ticket authenticates as the viewer, who may not run commands.
    const vt = await call('POST', '/v1/ws-tickets', viewerKey);
    assert.equal((await open(vt.body.ticket)).status, 403);
    const audit = await fetch(`${platform.url}/v1/audit`, { headers: { authorization: `Bearer ${platform.adminKey}`, accept: 'application/x-ndjson' } });
    const text = await audit.text();
    assert.match(text, /\/v1\/ws-tickets/);
    assert.ok(!text.includes(t.body.ticket) && !text.includes(vt.body.ticket), 'no ticket in the audit');
    assert.equal((await call('DELETE', `/v1/sandboxes/${sb.body.id}`, platform.adminKey)).status, 204);
  });

  test('an admin drives a sandbox from the browser; hostile strings stay text', async () => {
    const { context, page, problems } = await signedIn(platform.adminKey);
    try {
      // The key is in session storage only, never in the address.
      assert.equal(await page.evaluate('sessionStorage.getItem("dsec.apiKey")'), platform.adminKey);
      assert.ok(!page.url().includes(platform.adminKey));
      await page.getByTestId('nodes').locator('tbody tr').first().waitFor();
      // Every GET the page makes from here on (path, and whether it asked for a stream).
      const gets: string[] = [];
      page.on('request', (r) => {
        if (r.method() === 'GET') gets.push(`${new URL(r.url()).pathname}${(r.headers().accept ?? '').includes('ndjson') ? ' (stream)' : ''}`);
      });

      // Node use is pushed by the node usage stream: a sandbox made through the API shows in the
      // node's allocation and goes again when deleted, without a reload and without any request.
      const nodeRow = page.getByTestId('nodes').locator('tbody tr').first();
      const allocated = async (): Promise<number> => Number(/^(\d+) \//.exec(await nodeRow.locator('td').nth(5).innerText())?.[1] ?? NaN);
      const untilAllocated = async (n: number): Promise<void> => {
        for (const deadline = Date.now() + 15_000; (await allocated()) !== n; await page.waitForTimeout(100)) {
          assert.ok(Date.now() < deadline, `the node shows ${n} sandboxes (shows ${await allocated()})`);
        }
      };
      const held = await allocated();
      assert.ok(Number.isInteger(held), await nodeRow.innerText());
      const extra = await call('POST', '/v1/sandboxes', platform.adminKey, { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } });
      assert.equal(extra.status, 201, JSON.stringify(extra.body));
      await untilAllocated(held + 1);
      assert.equal((await call('DELETE', `/v1/sandboxes/${extra.body.id}`, platform.adminKey)).status, 204);
      await untilAllocated(held);
      assert.match(await nodeRow.locator('td').nth(7).innerText(), /^\d+%$/, 'the machine CPU comes on the stream');
      assert.equal(gets.length, 0, `the overview read nothing more (no /metrics, no node list): ${gets.join(' ')}`);

      // A project's usage follows the row events as well: read again after them, not polled.
      await page.getByTestId('nav-projects').click();
      const rootRow = page
        .getByTestId('projects')
        .locator('tbody tr')
        .filter({ has: page.locator('td', { hasText: /^root$/ }) });
      const rootUsage = async (): Promise<number> => Number(/^(\d+) \//.exec(await rootRow.locator('td').nth(3).innerText())?.[1] ?? NaN);
      for (const deadline = Date.now() + 15_000; !Number.isInteger(await rootUsage()); await page.waitForTimeout(100)) {
        assert.ok(Date.now() < deadline, 'the root project is shown with its usage');
      }
      const usedBefore = await rootUsage();
      const projectReads = (): number => gets.filter((g) => g === '/v1/projects').length;
      const readsAtStart = projectReads();
      const more = await call('POST', '/v1/sandboxes', platform.adminKey, { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } });
      assert.equal(more.status, 201, JSON.stringify(more.body));
      for (const deadline = Date.now() + 15_000; (await rootUsage()) !== usedBefore + 1; await page.waitForTimeout(100)) {
        assert.ok(Date.now() < deadline, `the project's usage shows the new sandbox (${await rootUsage()})`);
      }
      assert.equal((await call('DELETE', `/v1/sandboxes/${more.body.id}`, platform.adminKey)).status, 204);
      for (const deadline = Date.now() + 15_000; (await rootUsage()) !== usedBefore; await page.waitForTimeout(100)) {
        assert.ok(Date.now() < deadline, `the project's usage shows the deletion (${await rootUsage()})`);
      }
      assert.ok(projectReads() - readsAtStart <= 3, `read on events only: ${projectReads() - readsAtStart} reads`);
      // The overview reads its own list once its event stream is up: that read done before the
      // sandboxes page is opened, so that only that page's reads are counted below.
      const overviewRead = page.waitForResponse((r) => new URL(r.url()).pathname === '/v1/sandboxes', { timeout: 15_000 });
      await page.getByTestId('nav-overview').click();
      await overviewRead;

      // Every read of the sandbox list the page makes (it reads it once per filter, then follows events).
      const listReads: string[] = [];
      page.on('request', (r) => {
        const u = new URL(r.url());
        if (r.method() === 'GET' && u.pathname === '/v1/sandboxes') listReads.push(u.search);
      });
      await page.goto(`${platform.url}/ui/#/sandboxes`);
      await page.getByTestId('sandboxes').waitFor();

      // Made through the API while the page is open: it appears without a reload.
      const sb = await call('POST', '/v1/sandboxes', platform.adminKey, {
        image: { base: 'busybox' },
        resources: { memoryMiB: 64, diskMiB: 32 },
        labels: { job: 'dash', evil: HOSTILE },
      });
      assert.equal(sb.status, 201, JSON.stringify(sb.body));
      const id: string = sb.body.id;
      const row = page.getByTestId('sandboxes').locator('tr', { hasText: id });
      await row.waitFor({ timeout: 15_000 });
      assert.ok((await row.innerText()).includes(`evil=${HOSTILE}`), 'the label is shown as text');
      await shot(page, 'sandboxes');

      // Another one appears, shows its pause, and disappears when deleted through the API: all
      // from the event stream, with no further read of the list (the page used to poll it).
      const readsBefore = listReads.length;
      assert.equal(readsBefore, 1, listReads.join(' '));
      const other = await call('POST', '/v1/sandboxes', platform.adminKey, { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } });
      assert.equal(other.status, 201, JSON.stringify(other.body));
      const otherRow = page.getByTestId('sandboxes').locator('tr', { hasText: other.body.id });
      await otherRow.waitFor({ timeout: 15_000 });
      assert.equal((await call('POST', `/v1/sandboxes/${other.body.id}/pause`, platform.adminKey, {})).status, 200);
      await otherRow.locator('.state', { hasText: 'paused' }).waitFor({ timeout: 15_000 });
      assert.equal((await call('DELETE', `/v1/sandboxes/${other.body.id}`, platform.adminKey)).status, 204);
      await otherRow.waitFor({ state: 'detached', timeout: 15_000 });
      // Longer than the old poll's period: still no read of the list.
      await page.waitForTimeout(2500);
      assert.deepEqual(listReads.slice(readsBefore), [], 'the list was not read again');

      // Two more from the page, as one batch with its progress.
      await page.getByTestId('create-count').fill('2');
      await page.getByTestId('create-labels').fill('job=ui-batch');
      await page.getByTestId('create').click();
      await page.getByTestId('create-progress').getByText('2 created, 0 failed of 2 (done)').waitFor({ timeout: 30_000 });
      const made = await call('GET', '/v1/sandboxes?label=job%3Dui-batch', platform.adminKey);
      assert.equal(made.body.items.length, 2);
      // ...and deleted again with the bulk action.
      await page.getByTestId('filter-label').fill('job=ui-batch');
      // The filtered list has replaced the whole one: the first sandbox is gone from it.
      await row.waitFor({ state: 'detached', timeout: 15_000 });
      await page.getByTestId('sandboxes').locator('tbody tr').nth(1).locator('input[type=checkbox]').waitFor();
      assert.equal(await page.getByTestId('sandboxes').locator('tbody tr').count(), 2);
      for (const box of await page.getByTestId('sandboxes').locator('input[type=checkbox]').all()) await box.check();
      await page.getByTestId('bulk-delete').click();
      await page.getByTestId('sandboxes').getByText('nothing yet').waitFor({ timeout: 15_000 });
      assert.equal((await call('GET', '/v1/sandboxes?label=job%3Dui-batch', platform.adminKey)).body.items.length, 0);
      await page.getByTestId('filter-label').fill('');
      await row.waitFor({ timeout: 15_000 });

      // A hostile file name, made inside the sandbox.
      const put = await call('PUT', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(`/tmp/${HOSTILE}`)}`, platform.adminKey, undefined, Buffer.from('x'));
      assert.equal(put.status, 204, JSON.stringify(put.body));

      await row.getByRole('link', { name: id }).click();
      await page.getByTestId('sandbox-labels').waitFor();
      assert.ok((await page.getByTestId('sandbox-labels').innerText()).includes(HOSTILE));
      await page.getByTestId('chart-memory').waitFor();
      // The charts follow the sandbox's stats stream: processes started through the API show in
      // the page without a reload, on the one stream the page opened.
      const pidsNow = async (): Promise<number> => Number(/pids (\d+)/.exec(await page.getByTestId('stats-now').innerText())?.[1] ?? NaN);
      for (const deadline = Date.now() + 15_000; !Number.isInteger(await pidsNow()); await page.waitForTimeout(100)) {
        assert.ok(Date.now() < deadline, 'a first stats sample is shown');
      }
      const pidsBefore = await pidsNow();
      const bg = await call('POST', `/v1/sandboxes/${id}/exec`, platform.adminKey, {
        cmd: 'for i in 1 2 3; do sleep 60 </dev/null >/dev/null 2>&1 & done',
      });
      assert.equal(bg.status, 200, JSON.stringify(bg.body));
      for (const deadline = Date.now() + 15_000; (await pidsNow()) < pidsBefore + 3; await page.waitForTimeout(100)) {
        assert.ok(Date.now() < deadline, `the page shows the new processes (pids ${await pidsNow()}, before ${pidsBefore})`);
      }
      const statsReads = gets.filter((g) => g.startsWith(`/v1/sandboxes/${id}/stats`));
      assert.deepEqual(statsReads, [`/v1/sandboxes/${id}/stats (stream)`], 'one stats stream, no polling');
      assert.ok(!gets.includes('/metrics'));
      await shot(page, 'sandbox');

      // Terminal: a PTY shell over the exec WebSocket.
      await page.getByTestId('tab-terminal').click();
      await page.getByTestId('terminal-status').getByText('connected').waitFor({ timeout: 15_000 });
      await page.locator('.xterm-rows').getByText('#').first().waitFor({ timeout: 15_000 });
      await page.locator('.xterm-helper-textarea').focus();
      await page.keyboard.type('echo $((6*7))dash\n');
      await page.locator('.xterm-rows').getByText('42dash').waitFor({ timeout: 15_000 });
      await shot(page, 'terminal');

      // The shell is one of its processes; its output is read from offset 0.
      await page.getByTestId('tab-processes').click();
      await page.getByTestId('processes').locator('tr', { hasText: '/bin/sh -i' }).getByRole('button', { name: 'output' }).click();
      await page.getByTestId('process-output').getByText('42dash').first().waitFor({ timeout: 15_000 });

      // Files: the hostile name listed as text; upload, then download.
      await page.getByTestId('tab-files').click();
      const files = page.getByTestId('files');
      await files.locator('tr', { hasText: 'onerror' }).waitFor();
      assert.ok((await files.innerText()).includes(HOSTILE));
      await page.getByTestId('upload').setInputFiles({ name: 'hello.txt', mimeType: 'text/plain', buffer: Buffer.from('hello from the browser\n') });
      await files.locator('tr', { hasText: 'hello.txt' }).waitFor();
      const got = await call('GET', `/v1/sandboxes/${id}/files?path=/tmp/hello.txt`, platform.adminKey);
      assert.equal(got.body, 'hello from the browser\n');
      const [dl] = await Promise.all([page.waitForEvent('download'), page.getByTestId('download-hello.txt').click()]);
      assert.equal(dl.suggestedFilename(), 'hello.txt');
      assert.equal(await readFile(await dl.path(), 'utf8'), 'hello from the browser\n');
      await shot(page, 'files');

      // Network policy: edited in the page, in force through the API.
      await page.getByTestId('tab-network').click();
      // The policy in force is shown first (the edit must not race its loading).
      // (Polled from here: the page's CSP forbids the eval a string predicate would need.)
      for (const deadline = Date.now() + 15_000; !(await page.getByTestId('policy').inputValue()).includes('mode');) {
        assert.ok(Date.now() < deadline, 'the policy in force is shown');
        await page.waitForTimeout(100);
      }
      await page.getByTestId('policy').fill(JSON.stringify({ mode: 'allowlist', allow: [{ host: 'example.com', ports: [443] }] }, null, 2));
      await page.getByTestId('apply-policy').click();
      // Applied, or the error the page shows (named in the failure).
      await page.locator('[data-testid=policy-saved]:has-text("applied"), .action .error').first().waitFor({ timeout: 30_000 });
      const applyError = page.locator('.action .error');
      assert.equal(await applyError.count(), 0, `apply failed: ${(await applyError.allInnerTexts()).join('; ')}`);
      const net = await call('GET', `/v1/sandboxes/${id}/network`, platform.adminKey);
      assert.equal(net.body.policy.mode, 'allowlist');
      assert.equal(net.body.policy.allow[0].host, 'example.com');
      await shot(page, 'network');

      // Pause and resume from the page, each followed live in the sandbox's event stream.
      await page.getByTestId('tab-events').click();
      await page.getByTestId('sandbox-events-live').getByText('live').waitFor({ timeout: 15_000 });
      await page.getByTestId('pause').click();
      await page.getByTestId('sandbox-state').getByText('paused').waitFor({ timeout: 15_000 });
      assert.equal((await call('GET', `/v1/sandboxes/${id}`, platform.adminKey)).body.state, 'paused');
      await page.getByTestId('sandbox-events').locator('tr', { hasText: 'sandbox.paused' }).waitFor({ timeout: 15_000 });
      await page.getByTestId('resume').click();
      await page.getByTestId('sandbox-state').getByText('running').waitFor({ timeout: 15_000 });
      await page.getByTestId('sandbox-events').locator('tr', { hasText: 'sandbox.resumed' }).waitFor({ timeout: 15_000 });
      await shot(page, 'events');

      await page.getByTestId('tab-trajectory').click();
      await page.getByTestId('trajectory').locator('li', { hasText: 'hello.txt' }).waitFor();
      await shot(page, 'trajectory');
      await page.getByTestId('tab-diff').click();
      await page.getByTestId('diff').locator('tr', { hasText: '/tmp/hello.txt' }).waitFor();
      await shot(page, 'diff');

      if (SCREENSHOTS) {
        for (const name of ['overview', 'projects', 'keys', 'pools', 'layers', 'events']) {
          await page.getByTestId(`nav-${name}`).click();
          await page.waitForTimeout(name === 'overview' ? 4500 : 800);
          await shot(page, name === 'events' ? 'events-audit' : name);
        }
      }

      // Nothing hostile ran, no markup came from it, and the page broke no policy.
      assert.equal(await page.evaluate('window.__pwned'), undefined);
      assert.deepEqual(problems, []);
      assert.equal((await call('DELETE', `/v1/sandboxes/${id}`, platform.adminKey)).status, 204);
    } finally {
      await context.close();
    }
  });

  test("the keys and audit pages follow streams (one request each, no polling); a revoked key's page ends with the reason", async () => {
    const made = await call('POST', '/v1/keys', platform.adminKey, { name: 'dash-live', role: 'admin' });
    assert.equal(made.status, 201, JSON.stringify(made.body));
    const { context, page, problems } = await signedIn(made.body.key);
    try {
      const gets: string[] = [];
      page.on('request', (r) => {
        if (r.method() === 'GET') gets.push(`${new URL(r.url()).pathname}${(r.headers().accept ?? '').includes('ndjson') ? ' (stream)' : ''}`);
      });
      // Keys: a key made through the API appears on the open page, on the one followed request.
      await page.getByTestId('nav-keys').click();
      await page.getByTestId('keys-live').getByText('live').waitFor({ timeout: 15_000 });
      const watched = await call('POST', '/v1/keys', platform.adminKey, { name: 'made-while-watching', role: 'viewer' });
      assert.equal(watched.status, 201, JSON.stringify(watched.body));
      await page.getByTestId('keys').locator('tr', { hasText: 'made-while-watching' }).waitFor({ timeout: 15_000 });
      // Audit: a write made through the API appears as it is audited.
      await page.getByTestId('nav-events').click();
      await page.getByTestId('audit-live').getByText('live').waitFor({ timeout: 15_000 });
      assert.equal((await call('DELETE', `/v1/keys/${watched.body.id}`, platform.adminKey)).status, 204);
      // (The audit names the route, not the key.)
      await page.getByTestId('audit').locator('tr', { hasText: 'DELETE' }).filter({ hasText: '/v1/keys/:id' }).first().waitFor({ timeout: 15_000 });
      // Longer than the old polls' periods (keys 5 s, audit 3 s): still one request each.
      await page.waitForTimeout(3500);
      assert.deepEqual(
        gets.filter((g) => g.startsWith('/v1/keys') || g.startsWith('/v1/audit')),
        ['/v1/keys (stream)', '/v1/audit (stream)'],
        'each page followed its answer on one request',
      );
      // The page's own key revoked: its open streams end, and the page says why.
      assert.equal((await call('DELETE', `/v1/keys/${made.body.id}`, platform.adminKey)).status, 204);
      await page
        .getByRole('alert')
        .filter({ hasText: `key ${made.body.id} was revoked` })
        .first()
        .waitFor({ timeout: 15_000 });
      assert.match(await page.getByTestId('audit-live').innerText(), /connecting/);
      assert.deepEqual(problems, []);
    } finally {
      await context.close();
    }
  });

  test("a sandbox's row events (created, deleted) are seen by the keys that could see it, and only by them", async () => {
    const { member } = await testProject(platform, 'dash-rows');
    const stranger = (await testProject(platform, 'dash-stranger')).viewer;
    const sb = await call('POST', '/v1/sandboxes', member, { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 }, labels: { job: 'rows' } });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    const id: string = sb.body.id;
    assert.equal((await call('DELETE', `/v1/sandboxes/${id}`, member)).status, 204);
    const kinds = async (key: string): Promise<string[]> => {
      const r = await call('GET', `/v1/events?sandbox=${id}&kind=sandbox.created,sandbox.deleted&order=asc`, key);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return r.body.items.map((e: any) => e.kind);
    };
    // The deletion keeps the project of a row that is gone.
    assert.deepEqual(await kinds(member), ['sandbox.created', 'sandbox.deleted']);
    assert.deepEqual(await kinds(platform.adminKey), ['sandbox.created', 'sandbox.deleted']);
    assert.deepEqual(await kinds(stranger), []);
    const created = (await call('GET', `/v1/events?sandbox=${id}&kind=sandbox.created`, member)).body.items[0];
    assert.deepEqual([created.data.sandbox.id, created.data.sandbox.state, created.data.sandbox.labels], [id, 'running', { job: 'rows' }]);
  });

  test('a viewer sees no button it cannot use, and the API refuses it anyway', async () => {
    const sb = await call('POST', '/v1/sandboxes', platform.adminKey, {
      image: { base: 'busybox' },
      resources: { memoryMiB: 64, diskMiB: 16 },
      labels: { job: 'viewer' },
    });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    const id: string = sb.body.id;
    const { context, page, problems } = await signedIn(viewerKey);
    try {
      assert.match(await page.getByTestId('whoami').innerText(), /viewer/);
      assert.equal(await page.getByTestId('nav-keys').count(), 0, 'no keys page');
      await page.goto(`${platform.url}/ui/#/sandboxes`);
      await page.getByTestId('sandboxes').locator('tr', { hasText: id }).waitFor({ timeout: 15_000 });
      assert.equal(await page.locator('[data-testid^="bulk-"]').count(), 0);
      assert.equal(await page.locator('input[type=checkbox]').count(), 0);
      await page.goto(`${platform.url}/ui/#/sandbox/${id}`);
      await page.getByTestId('spec').waitFor();
      for (const t of ['pause', 'resume', 'delete', 'tab-terminal']) assert.equal(await page.getByTestId(t).count(), 0, t);
      await page.getByTestId('tab-files').click();
      await page.getByTestId('files').waitFor();
      assert.equal(await page.getByTestId('upload').count(), 0);
      await page.getByTestId('tab-network').click();
      await page.getByTestId('policy').waitFor();
      assert.equal(await page.getByTestId('apply-policy').count(), 0);
      assert.equal(await page.getByTestId('policy').getAttribute('readonly'), '');
      assert.deepEqual(problems, []);
      // The API refuses what the page does not offer.
      assert.equal((await call('POST', `/v1/sandboxes/${id}/pause`, viewerKey)).status, 403);
      assert.equal((await call('DELETE', `/v1/sandboxes/${id}`, viewerKey)).status, 403);
      assert.equal((await call('PUT', `/v1/sandboxes/${id}/network`, viewerKey, { mode: 'none' })).status, 403);
      assert.equal((await call('PUT', `/v1/sandboxes/${id}/files?path=/tmp/x`, viewerKey, undefined, Buffer.from('x'))).status, 403);
      assert.equal((await call('POST', '/v1/keys', viewerKey, { name: 'x', role: 'viewer' })).status, 403);
    } finally {
      await context.close();
      await call('DELETE', `/v1/sandboxes/${id}`, platform.adminKey);
    }
  });
});
