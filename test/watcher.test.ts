// The watcher end to end: events raised by real sandboxes (OOM kills, fork bombs at the pids
// limit, processes outliving their command, lease expiry, lost sandboxes), stored, filtered,
// scoped by project and streamed live over SSE; the audit trail; run-time rules; metrics; and
// garbage collection of what a crashed edge leaves behind.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { rename, rm, unlink } from 'node:fs/promises';
import net from 'node:net';
import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { ChronusClient } from '@dsec/edge';
import type { RaisedEvent } from '@dsec/protocol';
import { startNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { testProject } from './helpers/tenants.js';
import type { TestProject } from './helpers/tenants.js';

let platform: TestPlatform;

interface Reply {
  status: number;
  body: any;
  text: string;
  headers: Headers;
}

async function call(method: string, route: string, opts: { key?: string | null; json?: unknown; headers?: Record<string, string> } = {}): Promise<Reply> {
  const headers: Record<string, string> = { ...opts.headers };
  const key = opts.key === undefined ? platform.adminKey : opts.key;
  if (key) headers.authorization = `Bearer ${key}`;
  let body: string | undefined;
  if (opts.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.json);
  }
  const res = await fetch(platform.url + route, { method, headers, ...(body !== undefined ? { body } : {}) });
  const text = await res.text();
  let parsed: unknown = text;
  if ((res.headers.get('content-type') ?? '').includes('application/json')) parsed = JSON.parse(text);
  return { status: res.status, body: parsed, text, headers: res.headers };
}

function project(name: string): Promise<TestProject> {
  return testProject(platform, name);
}

async function create(key: string, spec: object = {}): Promise<string> {
  const r = await call('POST', '/v1/sandboxes', { key, json: { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 }, ...spec } });
  assert.equal(r.status, 201, r.text);
  return r.body.id as string;
}

async function exec(key: string, id: string, body: object): Promise<any> {
  const r = await call('POST', `/v1/sandboxes/${id}/exec`, { key, json: body });
  assert.equal(r.status, 200, r.text);
  return r.body;
}

/** Polls GET /v1/events until `pick` finds something or the time is up. */
async function waitForEvents(key: string, query: string, pick: (items: any[]) => boolean, timeoutMs = 20_000): Promise<any[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await call('GET', `/v1/events?${query}`, { key });
    assert.equal(r.status, 200, r.text);
    if (pick(r.body.items)) return r.body.items;
    if (Date.now() > deadline) assert.fail(`no matching event for ${query}: ${JSON.stringify(r.body.items)}`);
    await sleep(200);
  }
}

/** One SSE message. */
interface SseMessage {
  id?: string;
  event?: string;
  data?: string;
  comment?: string;
}

/** A live GET /v1/events stream, parsed into messages. */
async function openStream(
  key: string,
  query = '',
  lastEventId?: string,
): Promise<{ status: number; next(pick: (m: SseMessage) => boolean, timeoutMs?: number): Promise<SseMessage>; close(): void }> {
  const ctl = new AbortController();
  const headers: Record<string, string> = { authorization: `Bearer ${key}`, accept: 'text/event-stream' };
  if (lastEventId) headers['last-event-id'] = lastEventId;
  const res = await fetch(`${platform.url}/v1/events${query ? `?${query}` : ''}`, { headers, signal: ctl.signal });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  const queue: SseMessage[] = [];
  const parse = (): void => {
    for (let i = buf.indexOf('\n\n'); i >= 0; i = buf.indexOf('\n\n')) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const m: SseMessage = {};
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) m.comment = line.slice(1).trim();
        else if (line.startsWith('id: ')) m.id = line.slice(4);
        else if (line.startsWith('event: ')) m.event = line.slice(7);
        else if (line.startsWith('data: ')) m.data = line.slice(6);
      }
      queue.push(m);
    }
  };
  return {
    status: res.status,
    async next(pick, timeoutMs = 20_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const i = queue.findIndex(pick);
        if (i >= 0) return queue.splice(0, i + 1).pop()!;
        queue.length = 0;
        const left = deadline - Date.now();
        if (left <= 0) assert.fail('no matching SSE message in time');
        let timer: NodeJS.Timeout | undefined;
        const r = await Promise.race([reader.read(), new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), left)))]);
        clearTimeout(timer);
        if (r === 'timeout') assert.fail('no matching SSE message in time');
        if (r.done) assert.fail('stream ended');
        buf += decoder.decode(r.value, { stream: true });
        parse();
      }
    },
    close() {
      ctl.abort();
    },
  };
}

const eventOf = (m: SseMessage): any => (m.data ? JSON.parse(m.data) : undefined);

before(async () => {
  platform = await startTestPlatform({ watch: { heartbeatMs: 300 } });
});
after(async () => {
  await platform?.close();
});

describe('events', () => {
  test('an OOM kill and a fork bomb at the pids limit reach the live stream, are stored, filtered and scoped by project', async () => {
    const team = await project('ev-team');
    const other = await project('ev-other');
    const stream = await openStream(platform.adminKey, 'kind=oom.kill,pids.limit-hit');
    const teamStream = await openStream(team.viewer, 'kind=oom.kill');
    const otherStream = await openStream(other.member, 'kind=oom.kill');
    assert.equal(stream.status, 200);
    const id = await create(team.member, { resources: { memoryMiB: 32, pids: 16, diskMiB: 16 }, labels: { tier: 'batch' } });
    try {
      // A memory balloon past the limit.
      const oom = await exec(team.member, id, { argv: ['tail', '-c', '100m', '/dev/zero'] });
      assert.equal(oom.oomKilled, true, JSON.stringify(oom));
      const seen = eventOf(await stream.next((m) => eventOf(m)?.kind === 'oom.kill' && eventOf(m)?.sandbox === id));
      assert.equal(seen.project, team.id);
      assert.equal(seen.severity, 'warning');
      assert.ok(seen.data.count >= 1 && seen.data.memoryMiB === 32, JSON.stringify(seen));
      assert.equal(eventOf(await teamStream.next((m) => eventOf(m)?.sandbox === id)).kind, 'oom.kill');

      // A small fork bomb: the limit refuses forks; the command's group dies at its timeout.
      await exec(team.member, id, { cmd: 'for i in $(seq 1 40); do sleep 60 & done; wait', timeoutMs: 1500 });
      const hit = eventOf(await stream.next((m) => eventOf(m)?.kind === 'pids.limit-hit' && eventOf(m)?.sandbox === id));
      assert.equal(hit.data.pidsLimit, 16);
      assert.ok(hit.data.count >= 1);

      // Stored, and filtered by kind, sandbox and severity.
      const stored = await waitForEvents(
        team.viewer,
        `sandbox=${id}`,
        (items) => items.some((e) => e.kind === 'pids.limit-hit') && items.some((e) => e.kind === 'oom.kill'),
      );
      assert.ok(stored.every((e) => e.sandbox === id && e.project === team.id));
      const onlyOom = await call('GET', `/v1/events?sandbox=${id}&kind=oom.kill`, { key: team.viewer });
      assert.ok(onlyOom.body.items.length >= 1 && onlyOom.body.items.every((e: any) => e.kind === 'oom.kill'));
      const critical = await call('GET', `/v1/events?sandbox=${id}&severity=critical`, { key: team.viewer });
      assert.deepEqual(critical.body.items, []);
      // Oldest first and paging.
      const asc = await call('GET', `/v1/events?sandbox=${id}&order=asc&limit=1`, { key: team.viewer });
      assert.equal(asc.body.items.length, 1);
      assert.ok(asc.body.nextCursor);
      const page2 = await call('GET', `/v1/events?sandbox=${id}&order=asc&limit=1&cursor=${asc.body.nextCursor}`, { key: team.viewer });
      assert.ok(page2.body.items[0].id > asc.body.items[0].id);

      // Another project sees none of it, neither stored nor live.
      const hidden = await call('GET', `/v1/events?sandbox=${id}`, { key: other.member });
      assert.equal(hidden.status, 200);
      assert.deepEqual(hidden.body.items, []);
      await assert.rejects(
        otherStream.next((m) => m.data !== undefined, 1500),
        /no matching SSE message/,
      );
      // Heartbeats keep an idle stream alive.
      assert.ok((await otherStream.next((m) => m.comment?.startsWith('heartbeat') ?? false)).comment);

      // Denials by kind, events by kind and sandboxes by state in the metrics.
      const metrics = (await call('GET', '/metrics', { key: null })).text;
      assert.match(metrics, /dsec_denials_total\{kind="pids.limit-hit"\} [1-9]/);
      assert.match(metrics, /dsec_events_total\{kind="oom.kill",severity="warning"\} [1-9]/);
      assert.match(metrics, /dsec_sandboxes\{state="running"\} [1-9]/);
      assert.match(metrics, /dsec_exec_duration_ms_count [1-9]/);
      assert.match(metrics, /dsec_node_cpu_seconds_total\{node="[^"]+",mode="idle"\} \d/);
      assert.match(metrics, /dsec_node_memory_available_bytes\{node="[^"]+"\} [1-9]/);
    } finally {
      stream.close();
      teamStream.close();
      otherStream.close();
      await call('DELETE', `/v1/sandboxes/${id}`, { key: team.member });
    }
    // A client that goes away leaves no subscriber behind.
    const deadline = Date.now() + 10_000;
    while (!/^dsec_event_subscribers 0$/m.test((await call('GET', '/metrics', { key: null })).text)) {
      assert.ok(Date.now() < deadline, 'subscribers of closed streams linger');
      await sleep(100);
    }
  });

  test('a process that outlives its command is reported; a stream resumes after Last-Event-ID', async () => {
    const id = await create(platform.adminKey);
    try {
      await exec(platform.adminKey, id, { cmd: 'sleep 300 >/dev/null 2>&1 &' });
      // A command that leaves nothing behind is not reported.
      await exec(platform.adminKey, id, { cmd: 'sleep 0.01; echo done' });
      const items = await waitForEvents(platform.adminKey, `sandbox=${id}&kind=process.survived-command`, (i) => i.length > 0);
      assert.equal(items.length, 1, JSON.stringify(items));
      const ev = items[0];
      assert.deepEqual(
        ev.data.processes.map((p: any) => p.name),
        ['sleep'],
      );
      assert.match(ev.message, /sleep/);

      // Two more events; a stream resuming after the first replays the second before going live.
      await exec(platform.adminKey, id, { cmd: 'sleep 301 >/dev/null 2>&1 &' });
      const both = await waitForEvents(platform.adminKey, `sandbox=${id}&kind=process.survived-command&order=asc`, (i) => i.length >= 2);
      const resumed = await openStream(platform.adminKey, `sandbox=${id}`, both[0].id);
      try {
        const replayed = await resumed.next((m) => m.id !== undefined);
        assert.equal(replayed.id, both[1].id);
        await exec(platform.adminKey, id, { cmd: 'sleep 302 >/dev/null 2>&1 &' });
        const live = await resumed.next((m) => m.id !== undefined);
        assert.ok(live.id! > both[1].id);
        assert.equal(eventOf(live).kind, 'process.survived-command');
      } finally {
        resumed.close();
      }
      const bad = await call('GET', '/v1/events', { headers: { accept: 'text/event-stream', 'last-event-id': 'nope' } });
      assert.equal(bad.status, 400);
      assert.equal(bad.body.error.field, 'Last-Event-ID');
    } finally {
      await call('DELETE', `/v1/sandboxes/${id}`);
    }
  });

  test('lease.exceeded when a sandbox outlives its lifetime; sandbox.lost when it vanishes from its node', async () => {
    const team = await project('lease-team');
    const short = await create(team.member, { timeoutMs: 1000 });
    const ev = await waitForEvents(team.viewer, `sandbox=${short}&kind=lease.exceeded`, (i) => i.length > 0);
    assert.equal(ev[0].project, team.id);
    assert.match(ev[0].message, /exceeded its lifetime/);

    const gone = await create(team.member);
    // The node loses it behind the control plane's back.
    await platform.platform.edge.destroy(gone);
    const lost = await waitForEvents(team.viewer, `sandbox=${gone}&kind=sandbox.lost`, (i) => i.length > 0, 30_000);
    assert.equal(lost[0].severity, 'warning');
    assert.equal((await call('GET', `/v1/sandboxes/${gone}`, { key: team.member })).body.state, 'lost');
    assert.equal((await call('DELETE', `/v1/sandboxes/${gone}`, { key: team.member })).status, 204);
  });

  test('junk queries are 400s naming the field', async () => {
    for (const [q, field] of [
      ['kind=nope', 'query.kind'],
      ['severity=loud', 'query.severity'],
      ['since=yesterday', 'query.since'],
      ['limit=0', 'query.limit'],
      ['cursor=abc', 'query.cursor'],
      ['sandbox=..%2F', 'query.sandbox'],
      ['bogus=1', 'query.bogus'],
    ] as const) {
      const r = await call('GET', `/v1/events?${q}`);
      assert.equal(r.status, 400, `${q}: ${r.text}`);
      assert.equal(r.body.error.field, field, q);
    }
    assert.equal((await call('GET', '/v1/events', { key: null })).status, 401);
  });
});

describe('audit', () => {
  test('records API calls and execs with principal, route pattern and exit code, never the key; scoped and exportable', async () => {
    const team = await project('audit-team');
    const other = await project('audit-other');
    const id = await create(team.member);
    try {
      await exec(team.member, id, { argv: ['echo', 'hello'] });
      await exec(team.member, id, { cmd: 'exit 3' });
      // A streamed exec gets its exit status when the stream ends.
      const streamed = await fetch(`${platform.url}/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { authorization: `Bearer ${team.member}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
        body: JSON.stringify({ cmd: 'echo streamed; exit 5' }),
      });
      assert.match(await streamed.text(), /"exit"/);
      // A call with a made-up key.
      const fake = 'dsec_' + 'x'.repeat(32);
      assert.equal((await call('GET', '/v1/sandboxes', { key: fake })).status, 401);

      const deadline = Date.now() + 10_000;
      let items: any[] = [];
      while (Date.now() < deadline) {
        items = (await call('GET', `/v1/audit?sandbox=${id}&order=asc`, { key: team.admin })).body.items;
        if (items.filter((e: any) => e.route === '/v1/sandboxes/:id/exec').length >= 3) break;
        await sleep(100);
      }
      const execs = items.filter((e: any) => e.route === '/v1/sandboxes/:id/exec');
      assert.equal(execs.length, 3, JSON.stringify(items));
      const memberKeyId = execs[0].key as string;
      assert.match(memberKeyId, /^key_/);
      assert.deepEqual(
        execs.map((e: any) => [e.method, e.status, e.project, e.sandbox, e.command, e.exitCode]),
        [
          ['POST', 200, team.id, id, 'echo hello', 0],
          ['POST', 200, team.id, id, 'exit 3', 3],
          ['POST', 200, team.id, id, 'echo streamed; exit 5', 5],
        ],
      );
      assert.ok(execs.every((e: any) => e.key === memberKeyId && typeof e.durationMs === 'number'));
      // Filters: by key; another project sees nothing; a member sees its own project's calls.
      const byKey = await call('GET', `/v1/audit?key=${memberKeyId}&limit=1000`, { key: team.admin });
      assert.ok(byKey.body.items.length >= 4 && byKey.body.items.every((e: any) => e.key === memberKeyId));
      const created = byKey.body.items.find((e: any) => e.method === 'POST' && e.route === '/v1/sandboxes');
      assert.deepEqual([created?.status, created?.sandbox, created?.command], [201, null, null]);
      assert.deepEqual((await call('GET', `/v1/audit?sandbox=${id}`, { key: other.admin })).body.items, []);
      assert.ok((await call('GET', `/v1/audit?sandbox=${id}`, { key: team.viewer })).body.items.length >= 3);

      // The root admin sees everything, the failed call included (without a key).
      const all = await call('GET', '/v1/audit?limit=1000');
      assert.ok(all.body.items.some((e: any) => e.key === null && e.status === 401));

      // NDJSON export; no key, no secret anywhere in it.
      const exported = await call('GET', '/v1/audit', { headers: { accept: 'application/x-ndjson' } });
      assert.equal(exported.status, 200);
      assert.match(exported.headers.get('content-type') ?? '', /x-ndjson/);
      const lines = exported.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      assert.ok(lines.length >= 5);
      assert.ok(
        lines.every((l: any, i: number) => i === 0 || l.id > lines[i - 1].id),
        'oldest first',
      );
      for (const secret of [platform.adminKey, team.member, team.admin, fake]) assert.ok(!exported.text.includes(secret));
      const bad = await call('GET', '/v1/audit?key=dsec_abc');
      assert.equal(bad.status, 400);
      assert.equal(bad.body.error.field, 'query.key');
    } finally {
      await call('DELETE', `/v1/sandboxes/${id}`, { key: team.member });
    }
  });
});

describe('rules', () => {
  test('rule payloads are validated; only admins add rules; tenants cannot suppress', async () => {
    const team = await project('rules-team');
    for (const [body, field] of [
      [{ kind: 'deny-syscall', syscall: 'not_a_syscall' }, 'syscall'],
      [{ kind: 'deny-syscall', syscall: 'execve' }, 'syscall'],
      [{ kind: 'deny-path', path: 'etc/passwd' }, 'path'],
      [{ kind: 'deny-path', path: '/etc/../proc' }, 'path'],
      [{ kind: 'deny-domain', domain: 'not a domain' }, 'domain'],
      [{ kind: 'deny-domain', domain: 'Example.COM' }, 'domain'],
      [{ kind: 'event', match: {} }, 'severity'],
      [{ kind: 'event', match: { events: ['nope'] }, severity: 'critical' }, 'match.events.0'],
      [{ kind: 'event', match: {}, severity: 'critical', extra: 1 }, ''],
      [{ kind: 'drop-everything' }, 'kind'],
    ] as const) {
      const r = await call('POST', '/v1/rules', { json: body });
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      if (field) assert.equal(r.body.error.field, field, JSON.stringify(body));
    }
    assert.equal((await call('POST', '/v1/rules', { key: team.member, json: { kind: 'deny-path', path: '/etc' } })).status, 403);
    const suppress = await call('POST', '/v1/rules', { key: team.admin, json: { kind: 'event', match: {}, suppress: true } });
    assert.equal(suppress.status, 403);
    assert.equal(suppress.body.error.field, 'suppress');
    assert.equal((await call('DELETE', '/v1/rules/rl_nope')).status, 404);
  });

  test('deny-syscall applies to new sandboxes at once, not to running ones; deny-path is merged into new specs', async () => {
    const team = await project('tight-team');
    const running = await create(team.member);
    const chroot = { cmd: 'chroot / /bin/true 2>&1; echo rc=$?' };
    assert.match((await exec(team.member, running, chroot)).stdout, /rc=0/);

    const rule = await call('POST', '/v1/rules', { key: team.admin, json: { kind: 'deny-syscall', syscall: 'chroot', note: 'no chroot games' } });
    assert.equal(rule.status, 201, rule.text);
    assert.equal(rule.body.appliesTo, 'new sandboxes');
    const pathRule = await call('POST', '/v1/rules', { key: team.admin, json: { kind: 'deny-path', path: '/opt/answers' } });
    assert.equal(pathRule.status, 201, pathRule.text);
    // A rule of another project does not apply here.
    const elsewhere = await project('tight-other');
    const foreign = await call('POST', '/v1/rules', { key: elsewhere.admin, json: { kind: 'deny-syscall', syscall: 'sethostname' } });
    assert.equal(foreign.status, 201);
    const fresh = await create(team.member);
    try {
      const denied = await exec(team.member, fresh, chroot);
      assert.match(denied.stdout, /Operation not permitted/);
      assert.doesNotMatch(denied.stdout, /rc=0/);
      // The running sandbox keeps the seccomp filter it started with.
      assert.match((await exec(team.member, running, chroot)).stdout, /rc=0/);
      const sb = await call('GET', `/v1/sandboxes/${fresh}`, { key: team.member });
      assert.deepEqual(sb.body.protect, { readOnly: ['/opt/answers'], denySyscalls: ['chroot'] });

      const listed = await call('GET', '/v1/rules', { key: team.viewer });
      assert.deepEqual(listed.body.items.map((r: any) => r.id).sort(), [rule.body.id, pathRule.body.id].sort());
      assert.equal(listed.body.items.find((r: any) => r.id === rule.body.id).spec.syscall, 'chroot');
      assert.equal((await call('DELETE', `/v1/rules/${rule.body.id}`, { key: elsewhere.admin })).status, 404);
      assert.equal((await call('DELETE', `/v1/rules/${rule.body.id}`, { key: team.admin })).status, 204);
      assert.equal((await call('DELETE', `/v1/rules/${pathRule.body.id}`, { key: team.admin })).status, 204);
      assert.equal((await call('DELETE', `/v1/rules/${foreign.body.id}`, { key: elsewhere.admin })).status, 204);
      const after = await create(team.member);
      try {
        assert.match((await exec(team.member, after, chroot)).stdout, /rc=0/);
        assert.equal((await call('GET', `/v1/sandboxes/${after}`, { key: team.member })).body.protect, undefined);
      } finally {
        await call('DELETE', `/v1/sandboxes/${after}`, { key: team.member });
      }
    } finally {
      await call('DELETE', `/v1/sandboxes/${fresh}`, { key: team.member });
      await call('DELETE', `/v1/sandboxes/${running}`, { key: team.member });
    }
  });

  test('event rules raise severity by label and suppress by sandbox', async () => {
    const team = await project('evrule-team');
    const labelled = await create(team.member, { labels: { tier: 'eval' } });
    const quiet = await create(team.member);
    const raise = await call('POST', '/v1/rules', {
      key: team.admin,
      json: { kind: 'event', match: { events: ['process.survived-command'], labels: { tier: 'eval' } }, severity: 'critical' },
    });
    assert.equal(raise.status, 201, raise.text);
    const mute = await call('POST', '/v1/rules', { json: { kind: 'event', match: { sandbox: quiet }, suppress: true } });
    assert.equal(mute.status, 201, mute.text);
    try {
      await exec(team.member, labelled, { cmd: 'sleep 300 >/dev/null 2>&1 &' });
      await exec(team.member, quiet, { cmd: 'sleep 300 >/dev/null 2>&1 &' });
      const ev = await waitForEvents(team.viewer, `sandbox=${labelled}&severity=critical`, (i) => i.length > 0);
      assert.equal(ev[0].kind, 'process.survived-command');
      assert.equal(ev[0].data.rule, raise.body.id);
      // The muted sandbox's survivor was seen (counted) but not stored.
      const deadline = Date.now() + 10_000;
      while (!/dsec_events_suppressed_total\{kind="process.survived-command"\} [1-9]/.test((await call('GET', '/metrics', { key: null })).text)) {
        assert.ok(Date.now() < deadline, 'the suppressed event was never counted');
        await sleep(200);
      }
      assert.deepEqual((await call('GET', `/v1/events?sandbox=${quiet}&kind=process.survived-command`)).body.items, []);
    } finally {
      await call('DELETE', `/v1/rules/${raise.body.id}`, { key: team.admin });
      await call('DELETE', `/v1/rules/${mute.body.id}`);
      await call('DELETE', `/v1/sandboxes/${labelled}`, { key: team.member });
      await call('DELETE', `/v1/sandboxes/${quiet}`, { key: team.member });
    }
  });
});

describe('edge', () => {
  test('a malformed frame from a sandbox agent is a control.forged-message event and the connection closes', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-'));
    const sock = path.join(dir, 'agent.sock');
    // Something answering on an agent socket with a frame header that claims 4 GiB.
    const server = net.createServer((c) => c.write(Buffer.from([0xff, 0xff, 0xff, 0xff, 0x80, 0, 0, 0, 1, 0, 0, 0])));
    await new Promise<void>((r) => server.listen(sock, r));
    try {
      const errors: string[] = [];
      const client = await ChronusClient.connect(sock, { onProtocolError: (m) => errors.push(m) });
      await assert.rejects(client.ping(), /protocol error/);
      assert.equal(errors.length, 1);
      assert.equal(client.connected, false);
    } finally {
      server.close();
      await rm(dir, { recursive: true, force: true });
    }

    // The same through a real sandbox whose agent socket is taken over.
    const node = await startNode();
    try {
      const base =
        (await node.edge.layers.resolve('busybox').catch(() => undefined)) ??
        (await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' }));
      const sb = await node.edge.create({ image: { base: base.digest }, resources: { memoryMiB: 64 } });
      const edge = await node.restart(); // no connection to the agent yet
      const events: RaisedEvent[] = [];
      edge.onEvent((e) => events.push(e));
      const real = path.join(node.home, 'sandboxes', sb.id, 'agent.sock');
      await rename(real, real + '.real');
      // A reply whose one field claims 100 bytes in a 6-byte payload.
      const forger = net.createServer((c) => c.write(Buffer.from([6, 0, 0, 0, 0x80, 0, 0, 0, 1, 0, 0, 0, 1, 0, 100, 0, 0, 0])));
      await new Promise<void>((r) => forger.listen(real, r));
      try {
        await assert.rejects(edge.exec(sb.id, { argv: ['true'] }), /protocol error/);
        const forged = events.find((e) => e.kind === 'control.forged-message');
        assert.ok(forged, JSON.stringify(events));
        assert.equal(forged.sandboxId, sb.id);
        assert.equal(forged.severity, 'critical');
      } finally {
        forger.close();
        await unlink(real).catch(() => undefined);
        await rename(real + '.real', real);
      }
      const again = await node.restart();
      assert.equal((await again.exec(sb.id, { argv: ['true'] })).exitCode, 0);
    } finally {
      await node.cleanup();
    }
  });

  test('garbage collection after an edge crash: containers, cgroups and processes of sandboxes it lost are removed', async () => {
    const node = await startNode();
    try {
      const base =
        (await node.edge.layers.resolve('busybox').catch(() => undefined)) ??
        (await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' }));
      const spec = { image: { base: base.digest }, resources: { memoryMiB: 64 } };
      const lostDir = await node.edge.create(spec);
      const lostAll = await node.edge.create(spec);
      const kept = await node.edge.create(spec);
      await node.edge.exec(lostAll.id, { cmd: 'sleep 600 >/dev/null 2>&1 &' });
      const pids = [...(await node.edge.cgroups.procs(lostDir.id)), ...(await node.edge.cgroups.procs(lostAll.id))];
      assert.ok(pids.length >= 3, `pids ${pids}`);

      // The crash: the edge process goes away; one sandbox loses its folder (record, socket),
      // another its folder and the runtime's state too. Their processes keep running.
      await node.edge.close();
      const sandboxes = path.join(node.home, 'sandboxes');
      await rm(path.join(sandboxes, lostDir.id), { recursive: true, force: true });
      await rm(path.join(sandboxes, lostAll.id), { recursive: true, force: true });
      const crunRoot = path.join('/run/dsec', createHash('sha256').update(node.home).digest('hex').slice(0, 12), 'crun');
      assert.ok(existsSync(path.join(crunRoot, lostAll.id)), `crun state at ${crunRoot}`);
      await rm(path.join(crunRoot, lostAll.id), { recursive: true, force: true });
      assert.ok(pids.every((pid) => alive(pid)));

      const edge = await node.restart();
      const report = edge.lastStartGarbage!;
      assert.ok(report.containers.includes(lostDir.id), JSON.stringify(report));
      // The runtime's delete takes the first one's cgroups along; the second had only its cgroups left.
      assert.ok(report.cgroups.includes(lostAll.id), JSON.stringify(report));
      assert.ok(report.processes >= 1, JSON.stringify(report));
      assert.deepEqual(
        (await edge.list()).map((s) => s.id),
        [kept.id],
      );
      for (const id of [lostDir.id, lostAll.id]) {
        assert.deepEqual(await edge.cgroups.existing(id), [], `cgroups of ${id}`);
        assert.equal(existsSync(path.join(crunRoot, id)), false);
      }
      const deadline = Date.now() + 5000;
      while (pids.some(alive) && Date.now() < deadline) await sleep(50);
      assert.deepEqual(pids.filter(alive), [], 'every process of the lost sandboxes is gone');
      // What the node still knows is untouched, and a second collection finds nothing.
      assert.equal((await edge.exec(kept.id, { argv: ['true'] })).exitCode, 0);
      const second = await edge.collectGarbage();
      assert.deepEqual([second.containers, second.cgroups, second.dirs, second.processes], [[], [], [], 0]);
    } finally {
      await node.cleanup();
    }
  });
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie is dead for this purpose.
  try {
    return !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return false;
  }
}
