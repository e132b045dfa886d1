// End-to-end tests of the HTTP API against a real platform on loopback with real sandboxes.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import tar from 'tar-stream';
import WebSocket from 'ws';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { tarOf } from './helpers/assert.js';

let platform: TestPlatform;

interface Reply {
  status: number;
  body: any;
  headers: Headers;
}

async function call(
  method: string,
  route: string,
  opts: { key?: string | null | undefined; json?: unknown; body?: string | Uint8Array; headers?: Record<string, string> } = {},
): Promise<Reply> {
  const headers: Record<string, string> = { ...opts.headers };
  const key = opts.key === undefined ? platform.adminKey : opts.key;
  if (key) headers.authorization = `Bearer ${key}`;
  let body = opts.body;
  if (opts.json !== undefined) {
    headers['content-type'] = 'application/json';
    body = typeof opts.json === 'string' ? opts.json : JSON.stringify(opts.json);
  }
  const res = await fetch(platform.url + route, { method, headers, ...(body !== undefined ? { body, duplex: 'half' } : {}) });
  const type = res.headers.get('content-type') ?? '';
  const parsed = type.includes('application/json') ? await res.json() : Buffer.from(await res.arrayBuffer());
  return { status: res.status, body: parsed, headers: res.headers };
}

async function create(key: string | null | undefined, spec: object = {}): Promise<Reply> {
  return call('POST', '/v1/sandboxes', { key, json: { image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 }, ...spec } });
}

async function project(name: string, quota?: object): Promise<{ id: string; member: string; viewer: string; admin: string }> {
  const p = await call('POST', '/v1/projects', { json: { name, ...(quota ? { quota } : {}) } });
  assert.equal(p.status, 201, JSON.stringify(p.body));
  const key = async (role: string) => {
    const k = await call('POST', '/v1/keys', { json: { name: `${name}-${role}`, role, project: p.body.id } });
    assert.equal(k.status, 201, JSON.stringify(k.body));
    return k.body.key as string;
  };
  return { id: p.body.id, member: await key('member'), viewer: await key('viewer'), admin: await key('admin') };
}

before(async () => {
  platform = await startTestPlatform();
});
after(async () => {
  await platform?.close();
});

describe('identity and access', () => {
  test('missing, unknown and revoked keys are 401; a viewer cannot create; projects are isolated', async () => {
    assert.equal((await call('GET', '/v1/sandboxes', { key: null })).status, 401);
    const bad = await call('GET', '/v1/sandboxes', { key: 'dsec_nope' });
    assert.equal(bad.status, 401);
    assert.equal(bad.body.error.code, 'UNAUTHENTICATED');

    const a = await project('team-a');
    const b = await project('team-b');
    const denied = await create(a.viewer);
    assert.equal(denied.status, 403);
    assert.equal(denied.body.error.code, 'PERMISSION_DENIED');

    const sb = await create(a.member, { labels: { team: 'a' } });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    try {
      assert.equal(sb.body.project, a.id);
      assert.equal((await call('GET', `/v1/sandboxes/${sb.body.id}`, { key: a.viewer })).status, 200);
      const other = await call('GET', `/v1/sandboxes/${sb.body.id}`, { key: b.member });
      assert.equal(other.status, 404);
      assert.equal(other.body.error.code, 'SANDBOX_NOT_FOUND');
      assert.equal((await call('POST', `/v1/sandboxes/${sb.body.id}/exec`, { key: b.admin, json: { cmd: 'true' } })).status, 404);
      assert.equal((await call('DELETE', `/v1/sandboxes/${sb.body.id}`, { key: b.admin })).status, 404);
      assert.deepEqual((await call('GET', '/v1/sandboxes', { key: b.member })).body.items, []);
      // The root admin sees every project's sandboxes.
      assert.ok((await call('GET', '/v1/sandboxes?label=team=a')).body.items.some((s: { id: string }) => s.id === sb.body.id));
      // A member cannot mint keys; an admin cannot mint keys for a project it cannot see.
      assert.equal((await call('POST', '/v1/keys', { key: a.member, json: { name: 'x', role: 'viewer' } })).status, 403);
      assert.equal((await call('POST', '/v1/keys', { key: a.admin, json: { name: 'x', role: 'viewer', project: b.id } })).status, 404);
    } finally {
      assert.equal((await call('DELETE', `/v1/sandboxes/${sb.body.id}`, { key: a.member })).status, 204);
    }

    const keys = await call('GET', '/v1/keys', { key: a.admin });
    const viewerKey = keys.body.items.find((k: { name: string }) => k.name === 'team-a-viewer');
    assert.ok(viewerKey && !('key' in viewerKey), 'listed keys carry no secret');
    assert.equal((await call('DELETE', `/v1/keys/${viewerKey.id}`, { key: a.admin })).status, 204);
    assert.equal((await call('GET', '/v1/sandboxes', { key: a.viewer })).status, 401);
  });

  test('50 concurrent creates never over-admit a quota; sub-projects cannot exceed their parent', async () => {
    const job = await project('rl-job', { sandboxes: 5, cpu: 100, memoryMiB: 100_000 });
    const tooBig = await call('POST', '/v1/projects', { key: job.admin, json: { name: 'agent', quota: { sandboxes: 6 } } });
    assert.equal(tooBig.status, 403);
    assert.equal(tooBig.body.error.field, 'quota.sandboxes');
    const agent = await call('POST', '/v1/projects', { key: job.admin, json: { name: 'agent', quota: { sandboxes: 3 } } });
    assert.equal(agent.status, 201);

    const results = await Promise.all(Array.from({ length: 50 }, () => create(job.member)));
    const ok = results.filter((r) => r.status === 201);
    const refused = results.filter((r) => r.status === 429);
    try {
      assert.equal(ok.length, 5, `admitted ${ok.length}`);
      assert.equal(refused.length, 45);
      for (const r of refused) {
        assert.equal(r.body.error.code, 'QUOTA_EXCEEDED');
        assert.ok(Number(r.headers.get('retry-after')) >= 1);
      }
      const usage = (await call('GET', `/v1/projects/${job.id}`, { key: job.admin })).body.usage;
      assert.equal(usage.sandboxes, 5);
    } finally {
      await Promise.all(ok.map((r) => call('DELETE', `/v1/sandboxes/${r.body.id}`, { key: job.member })));
    }
    assert.equal((await call('GET', `/v1/projects/${job.id}`, { key: job.admin })).body.usage.sandboxes, 0);
  });
});

describe('input validation', () => {
  test('malformed bodies and queries get a 400 naming the field, and create nothing', async () => {
    const cases: Array<[unknown, string]> = [
      [{}, 'image'],
      [{ image: {} }, 'image.base'],
      [{ image: { base: 'busybox' }, resources: { memoryMiB: 'lots' } }, 'resources.memoryMiB'],
      [{ image: { base: 'busybox' }, resources: { cpu: -1 } }, 'resources.cpu'],
      [{ image: { base: 'busybox' }, labels: { 'bad key!': 'x' } }, 'labels.bad key!'],
      [{ image: { base: 'busybox' }, env: { '1X': 'y' } }, 'env.1X'],
      [{ image: { base: 'busybox' }, surprise: true }, ''],
      [{ image: { base: 'Not A Ref' } }, 'image.base'],
      [{ image: { base: 'busybox' }, timeoutMs: 5 }, 'timeoutMs'],
    ];
    for (const [body, field] of cases) {
      const r = await call('POST', '/v1/sandboxes', { json: body });
      assert.equal(r.status, 400, `${JSON.stringify(body)} -> ${r.status} ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error.code, 'INVALID_ARGUMENT');
      if (field) assert.equal(r.body.error.field, field, JSON.stringify(r.body));
    }
    const notJson = await call('POST', '/v1/sandboxes', { json: '{"image":' });
    assert.equal(notJson.status, 400);
    assert.equal(notJson.body.error.field, 'body');
    const unknownLayer = await call('POST', '/v1/sandboxes', { json: { image: { base: 'busybox', toolkits: ['nope'] } } });
    assert.equal(unknownLayer.status, 404);
    assert.equal(unknownLayer.body.error.field, 'image.toolkits.0');
    const badLimit = await call('GET', '/v1/sandboxes?limit=100000');
    assert.equal(badLimit.status, 400);
    assert.equal(badLimit.body.error.field, 'query.limit');
    assert.deepEqual((await call('GET', '/v1/sandboxes')).body.items, []);
    assert.equal((await call('GET', '/v1/nope')).status, 404);
  });

  test('junk on every route is a 4xx, never a 500', async () => {
    const sb = await create(undefined);
    assert.equal(sb.status, 201);
    const id = sb.body.id as string;
    try {
      const junk: Array<[string, string, unknown?]> = [
        ['GET', `/v1/sandboxes/${'x'.repeat(5000)}`],
        ['GET', '/v1/sandboxes/%E0%A4%A'],
        ['GET', '/v1/sandboxes?cursor=%%%'],
        ['GET', '/v1/sandboxes?cursor=AAAA'],
        ['GET', '/v1/sandboxes?state=sleeping'],
        ['GET', '/v1/sandboxes?label=novalue'],
        ['POST', `/v1/sandboxes/${id}/exec`, { argv: [] }],
        ['POST', `/v1/sandboxes/${id}/exec`, { cmd: 'true', env: { A: 5 } }],
        ['POST', `/v1/sandboxes/${id}/exec`, { cmd: 'true', timeoutMs: -1 }],
        ['POST', `/v1/sandboxes/${id}/exec`, [1, 2, 3]],
        ['POST', `/v1/sandboxes/${id}/exec`, 'null'],
        ['GET', `/v1/sandboxes/${id}/files?path=/etc/passwd&offset=-1`],
        ['GET', `/v1/sandboxes/${id}/files?path=/etc`],
        ['GET', `/v1/sandboxes/${id}/files?path=/a%00b`],
        ['GET', `/v1/sandboxes/${id}/files/list?path=/etc/passwd`],
        ['POST', `/v1/sandboxes/${id}/files/rename`, { from: '/nope', to: 'rel' }],
        ['GET', `/v1/sandboxes/${id}/processes/abc/output`],
        ['GET', `/v1/sandboxes/${id}/processes/1/output?from=-5`],
        ['POST', `/v1/sandboxes/${id}/processes/424242/signal`, { signal: 'SIGTERM' }],
        ['POST', '/v1/layers?kind=base&name=UPPER', ''],
        ['GET', '/v1/layers/sha256:nothex'],
        ['DELETE', '/v1/layers/no-such-layer'],
        ['POST', '/v1/projects', { name: 'Bad Name' }],
        ['POST', '/v1/projects', { name: 'ok', parent: 'prj_nope' }],
        ['POST', '/v1/keys', { name: 'k', role: 'god' }],
        ['DELETE', '/v1/keys/key_nope'],
        ['GET', '/v1/projects/prj_nope'],
      ];
      for (const [method, route, json] of junk) {
        const r = await call(method, route, json === undefined ? {} : typeof json === 'string' ? { body: json } : { json });
        assert.ok(r.status >= 400 && r.status < 500, `${method} ${route} ${JSON.stringify(json)} -> ${r.status} ${JSON.stringify(r.body)}`);
        assert.equal(typeof r.body.error?.code, 'string', `${method} ${route}: an error body`);
      }
    } finally {
      await call('DELETE', `/v1/sandboxes/${id}`);
    }
  });
});

describe('sandboxes, commands and files', () => {
  let id: string;
  before(async () => {
    const r = await create(undefined, { labels: { suite: 'api' }, env: { GREETING: 'hi' } });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    id = r.body.id;
  });
  after(async () => {
    await call('DELETE', `/v1/sandboxes/${id}`);
  });

  test('get, list with label filter and pagination, stats', async () => {
    const got = await call('GET', `/v1/sandboxes/${id}`);
    assert.equal(got.body.state, 'running');
    assert.deepEqual(got.body.envKeys, ['GREETING']);
    assert.equal(got.body.node, got.body.id.slice(0, -17));
    const extra = await create(undefined, { labels: { suite: 'other' } });
    try {
      const filtered = await call('GET', '/v1/sandboxes?label=suite=api');
      assert.deepEqual(
        filtered.body.items.map((s: { id: string }) => s.id),
        [id],
      );
      const page1 = await call('GET', '/v1/sandboxes?limit=1');
      assert.equal(page1.body.items.length, 1);
      assert.ok(page1.body.nextCursor);
      const page2 = await call('GET', `/v1/sandboxes?limit=1&cursor=${page1.body.nextCursor}`);
      assert.equal(page2.body.items.length, 1);
      assert.notEqual(page2.body.items[0].id, page1.body.items[0].id);
      assert.equal(page2.body.nextCursor, null);
    } finally {
      await call('DELETE', `/v1/sandboxes/${extra.body.id}`);
    }
    const stats = await call('GET', `/v1/sandboxes/${id}/stats`);
    assert.equal(stats.body.memoryLimitBytes, 64 * 1024 * 1024);
  });

  test('exec returns results; non-zero exit is a result; stdin; env from create', async () => {
    const r = await call('POST', `/v1/sandboxes/${id}/exec`, { json: { cmd: 'echo $GREETING; cat; exit 4', stdin: 'in' } });
    assert.equal(r.status, 200);
    assert.equal(r.body.exitCode, 4);
    assert.equal(r.body.stdout, 'hi\nin');
    const bin = await call('POST', `/v1/sandboxes/${id}/exec`, { json: { argv: ['wc', '-c'], stdinBase64: Buffer.alloc(1000, 0xff).toString('base64') } });
    assert.equal(bin.body.stdout.trim(), '1000');
    const bad = await call('POST', `/v1/sandboxes/${id}/exec`, { json: { cmd: 'true', argv: ['true'] } });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.field, 'cmd');
  });

  test('streaming exec, then reattach from a byte offset after the client went away', async () => {
    const ac = new AbortController();
    const res = await fetch(`${platform.url}/v1/sandboxes/${id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
      body: JSON.stringify({ cmd: 'for i in 1 2 3 4 5 6; do echo line$i; sleep 0.2; done' }),
      signal: ac.signal,
    });
    assert.equal(res.headers.get('content-type'), 'application/x-ndjson');
    const reader = res.body!.getReader();
    let text = '';
    let seen = '';
    let pid = -1;
    while (!seen.includes('line2')) {
      const { value, done } = await reader.read();
      assert.ok(!done);
      text += Buffer.from(value).toString();
      const lines = text.split('\n');
      text = lines.pop() ?? '';
      for (const l of lines) {
        const ev = JSON.parse(l);
        if (ev.type === 'start') pid = ev.pid;
        if (ev.type === 'output') seen += Buffer.from(ev.data, 'base64').toString();
      }
    }
    ac.abort();
    const procs = await call('GET', `/v1/sandboxes/${id}/processes`);
    const proc = procs.body.items.find((p: { pid: number }) => p.pid === pid);
    assert.ok(proc, 'the command is listed');
    const offset = Buffer.byteLength(seen);
    const rest = await call('GET', `/v1/sandboxes/${id}/processes/${pid}/output?from=${offset}`);
    const events = rest.body
      .toString()
      .trim()
      .split('\n')
      .map((l: string) => JSON.parse(l));
    const tail = events
      .filter((e: { type: string }) => e.type === 'output')
      .map((e: { data: string }) => Buffer.from(e.data, 'base64').toString())
      .join('');
    assert.equal(`${seen}${tail}`, [1, 2, 3, 4, 5, 6].map((i) => `line${i}\n`).join(''));
    assert.equal(events.at(-1).type, 'exit');
    assert.equal(events.at(-1).exitCode, 0);
    assert.equal((await call('GET', `/v1/sandboxes/${id}/processes/999999/output`)).status, 404);
  });

  test('stdin and signals to a running process by handle', async () => {
    const res = await fetch(`${platform.url}/v1/sandboxes/${id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
      body: JSON.stringify({ argv: ['sleep', '60'] }),
    });
    const reader = res.body!.getReader();
    const first = JSON.parse(
      Buffer.from((await reader.read()).value)
        .toString()
        .split('\n')[0]!,
    );
    assert.equal((await call('POST', `/v1/sandboxes/${id}/processes/${first.pid}/signal`, { json: { signal: 'SIGTERM' } })).status, 204);
    let text = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
    const exit = text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .at(-1);
    assert.equal(exit.type, 'exit');
    assert.equal(exit.signal, 'SIGTERM');
    assert.equal((await call('POST', `/v1/sandboxes/${id}/processes/${first.pid}/signal`, { json: { signal: 'NOPE!' } })).status, 400);
  });

  test('WebSocket exec with interactive stdin', async () => {
    const ws = new WebSocket(`${platform.url.replace('http', 'ws')}/v1/sandboxes/${id}/exec/ws`, { headers: { authorization: `Bearer ${platform.adminKey}` } });
    const events: any[] = [];
    const closed = new Promise<void>((resolve) => ws.on('close', () => resolve()));
    ws.on('message', (m: Buffer) => events.push(JSON.parse(m.toString())));
    await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject));
    ws.send(JSON.stringify({ argv: ['sh', '-c', 'read a; echo got:$a; read b; echo got:$b'] }));
    ws.send(JSON.stringify({ type: 'stdin', data: Buffer.from('one\n').toString('base64') }));
    ws.send(JSON.stringify({ type: 'stdin', data: Buffer.from('two\n').toString('base64') }));
    ws.send(JSON.stringify({ type: 'eof' }));
    await closed;
    const out = events
      .filter((e) => e.type === 'output')
      .map((e) => Buffer.from(e.data, 'base64').toString())
      .join('');
    assert.equal(out, 'got:one\ngot:two\n');
    assert.equal(events.at(-1).type, 'exit');
    const unauth = new WebSocket(`${platform.url.replace('http', 'ws')}/v1/sandboxes/${id}/exec/ws`);
    const status = await new Promise<number>((resolve) =>
      unauth.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0)).on('error', () => undefined),
    );
    assert.equal(status, 401);
  });

  test('files: write, read, range, list, stat, mkdir, rename, delete, tar up and down', async () => {
    const q = (p: string) => `/v1/sandboxes/${id}/files?path=${encodeURIComponent(p)}`;
    assert.equal((await call('PUT', q('/data/a.txt'), { body: 'hello world' })).status, 404);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/files/mkdir?path=/data`)).status, 204);
    assert.equal((await call('PUT', q('/data/a.txt') + '&mode=600', { body: 'hello world' })).status, 204);
    assert.equal((await call('GET', q('/data/a.txt'))).body.toString(), 'hello world');
    assert.equal((await call('GET', q('/data/a.txt') + '&offset=6&length=5')).body.toString(), 'world');
    const stat = await call('GET', `/v1/sandboxes/${id}/files/stat?path=/data/a.txt`);
    assert.deepEqual([stat.body.type, stat.body.size, stat.body.mode], ['file', 11, 0o600]);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/files/rename`, { json: { from: '/data/a.txt', to: '/data/b.txt' } })).status, 204);
    const list = await call('GET', `/v1/sandboxes/${id}/files/list?path=/data`);
    assert.deepEqual(
      list.body.items.map((e: { name: string }) => e.name),
      ['b.txt'],
    );
    assert.equal((await call('GET', `/v1/sandboxes/${id}/files/stat?path=relative`)).body.error.field, 'query.path');
    const missing = await call('GET', q('/nope'));
    assert.equal(missing.status, 404);
    assert.equal(missing.body.error.code, 'FILE_NOT_FOUND');

    const archive = await tarOf({ 'proj/src/main.py': 'print(1)\n', 'proj/README': 'readme\n' });
    const up = await call('PUT', `/v1/sandboxes/${id}/files/tar?path=/work`, { body: archive });
    assert.equal(up.status, 204);
    const check = await call('POST', `/v1/sandboxes/${id}/exec`, { json: { cmd: 'cat /work/proj/src/main.py /work/proj/README' } });
    assert.equal(check.body.stdout, 'print(1)\nreadme\n');
    const evil = await tarOf({ '../../etc/evil': 'x' });
    assert.equal((await call('PUT', `/v1/sandboxes/${id}/files/tar?path=/work`, { body: evil })).status, 400);
    const down = await call('GET', `/v1/sandboxes/${id}/files/tar?path=/work/proj`);
    assert.equal(down.status, 200);
    const extract = tar.extract();
    const names: Record<string, string> = {};
    const done = (async () => {
      for await (const entry of extract) {
        const chunks: Buffer[] = [];
        for await (const c of entry) chunks.push(c as Buffer);
        names[entry.header.name] = Buffer.concat(chunks).toString();
      }
    })();
    extract.end(down.body);
    await done;
    assert.equal(names['src/main.py'], 'print(1)\n');
    assert.equal(names['README'], 'readme\n');
    assert.equal((await call('DELETE', q('/work') + '&recursive=true')).status, 204);
    assert.equal((await call('GET', `/v1/sandboxes/${id}/files/stat?path=/work`)).status, 404);
  });
});

describe('layers', () => {
  test('upload a workspace, use it, keep it private to the project, refuse deleting it in use', async () => {
    const a = await project('layers-a');
    const b = await project('layers-b');
    const archive = await tarOf({ 'repo/hello.txt': 'from the workspace\n' });
    const up = await call('POST', '/v1/layers?kind=workspace&name=repo:v1', { key: a.member, body: archive });
    assert.equal(up.status, 201, JSON.stringify(up.body));
    assert.equal(up.body.project, a.id);
    assert.deepEqual(up.body.names, ['repo:v1']);
    const listed = await call('GET', '/v1/layers', { key: a.member });
    assert.ok(listed.body.items.some((l: { names: string[] }) => l.names.includes('repo:v1')));
    assert.ok(listed.body.items.some((l: { project: string }) => l.project === 'public'));
    assert.ok(!(await call('GET', '/v1/layers', { key: b.member })).body.items.some((l: { names: string[] }) => l.names.includes('repo:v1')));

    const refused = await create(b.member, { image: { base: 'busybox', workspace: 'repo:v1' } });
    assert.equal(refused.status, 404);
    assert.equal(refused.body.error.field, 'image.workspace');
    const sb = await create(a.member, { image: { base: 'busybox', workspace: 'repo:v1' } });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    try {
      const r = await call('POST', `/v1/sandboxes/${sb.body.id}/exec`, { key: a.member, json: { cmd: 'cat /repo/hello.txt' } });
      assert.equal(r.body.stdout, 'from the workspace\n');
      assert.equal((await call('DELETE', '/v1/layers/repo:v1', { key: a.member })).status, 409);
    } finally {
      await call('DELETE', `/v1/sandboxes/${sb.body.id}`, { key: a.member });
    }
    assert.equal((await call('DELETE', '/v1/layers/repo:v1', { key: a.member })).status, 204);
    assert.equal((await call('GET', '/v1/layers/repo:v1', { key: a.member })).status, 404);
    const garbage = await call('POST', '/v1/layers?kind=toolkit', { key: a.member, body: Buffer.from('not a tar at all, not at all') });
    assert.equal(garbage.status, 422);
    assert.equal(garbage.body.error.code, 'LAYER_INVALID');
    assert.equal((await call('POST', '/v1/layers?kind=nope', { key: a.member, body: archive })).body.error.field, 'query.kind');
  });
});

describe('service routes', () => {
  test('nodes, health, metrics, OpenAPI, lifetime expiry', async () => {
    const nodes = await call('GET', '/v1/nodes');
    assert.equal(nodes.body.items.length, 1);
    const n = nodes.body.items[0];
    assert.ok(n.healthy && n.backends.includes('container') && n.capacity.cpu > 0);
    assert.ok(n.allocatable.cpu > n.capacity.cpu, 'CPU is over-committed');
    assert.equal((await call('GET', '/healthz', { key: null })).body.status, 'ok');
    const metrics = (await call('GET', '/metrics', { key: null })).body.toString();
    assert.match(metrics, /dsec_http_requests_total\{method="POST",route="\/v1\/sandboxes",status="201"\} \d+/);
    assert.match(metrics, /dsec_sandboxes_created_total \d+/);
    // The process's own figures: memory (the heap's use within what it reserved), CPU, loop delay.
    const gauge = (name: string): number => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1]);
    assert.ok(gauge('process_resident_memory_bytes') > gauge('nodejs_heap_used_bytes'), metrics);
    assert.ok(gauge('nodejs_heap_used_bytes') > 0 && gauge('nodejs_heap_used_bytes') <= gauge('nodejs_heap_total_bytes'));
    assert.ok(gauge('process_cpu_seconds_total') > 0);
    assert.match(metrics, /^nodejs_eventloop_delay_seconds\{quantile="0\.99"\} [\d.]+$/m);
    const doc = (await call('GET', '/v1/openapi.json', { key: null })).body;
    assert.equal(doc.openapi, '3.1.0');
    assert.ok(doc.paths['/v1/sandboxes'].post.requestBody.content['application/json'].schema.properties.image);

    const short = await create(undefined, { timeoutMs: 1000 });
    assert.equal(short.status, 201);
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && (await call('GET', `/v1/sandboxes/${short.body.id}`)).status === 200) await new Promise((r) => setTimeout(r, 250));
    assert.equal((await call('GET', `/v1/sandboxes/${short.body.id}`)).status, 404, 'an expired sandbox is destroyed');
  });
});
