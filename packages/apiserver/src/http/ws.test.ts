import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { WebSocket } from 'ws';
import { DEFAULT_TENANT_LIMITS } from '@dsec/protocol';
import type { OutputEvent, ProcessStream } from '@dsec/protocol';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { carriesInput } from './vnc-ws.js';
import { createWsHandler } from './ws.js';

/**
 * A VNC connection as the node hands it over: it records what the viewer wrote and whether it
 * was closed (the fake node has no VM; the real one is tried in test/vm-desktop.test.ts).
 */
class RecordedVnc implements ProcessStream {
  readonly pid = 1;
  readonly osPid = 1;
  readonly exited = new Promise<never>(() => undefined);
  readonly written: Buffer[] = [];
  detached = false;
  private readonly ended: Array<() => void> = [];

  write(data: Uint8Array | string): Promise<void> {
    this.written.push(Buffer.from(data));
    return Promise.resolve();
  }
  closeStdin(): Promise<void> {
    return Promise.resolve();
  }
  kill(): Promise<void> {
    return Promise.resolve();
  }
  detach(): Promise<void> {
    this.detached = true;
    for (const fn of this.ended.splice(0)) fn();
    return Promise.resolve();
  }
  onDetach(fn: () => void): void {
    this.ended.push(fn);
  }
  async *[Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    yield { kind: 'data', stream: 'stdout', offset: 0, data: Buffer.from('RFB 003.008\n') };
    await new Promise<void>((resolve) => (this.detached ? resolve() : this.onDetach(resolve)));
  }
}

/** Resolves when `check` holds (polled), or fails after 10 s. */
async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('the WebSocket routes (fake node, real store)', () => {
  let h: Harness;
  let server: Server;
  let url: string;
  const streams: RecordedVnc[] = [];
  // Each VNC connect waits for this gate (open unless a test closes it).
  let gate: Promise<void> = Promise.resolve();
  // The server's side of each upgrade request.
  const upgrading: Duplex[] = [];
  before(async () => {
    h = await harness({ limits: { ...DEFAULT_TENANT_LIMITS, execsPerTenant: 3 } });
    h.edge.screen.connect = async () => {
      await gate;
      const s = new RecordedVnc();
      streams.push(s);
      return s;
    };
    const ws = createWsHandler(h.services);
    server = createServer((_req, res) => res.writeHead(404).end());
    server.on('upgrade', (req, socket, head) => {
      upgrading.push(socket);
      ws.handle(req, socket, head);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `ws://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await h.close();
  });

  const slotsInUse = (): number => h.services.slots.inUse('exec', h.admin.tenantId);

  /**
   * Sends an upgrade request for `path`, then the connection ends on the server's side before
   * the route is set up (as when Node sees the client's reset, a timeout, or a shutdown).
   */
  const upgradeAndGo = async (path: string, settingUp: () => boolean): Promise<void> => {
    const { port } = server.address() as AddressInfo;
    const sock = connect(port, '127.0.0.1');
    sock.on('error', () => undefined);
    await new Promise((resolve) => sock.once('connect', resolve));
    const seen = upgrading.length;
    sock.write(
      `GET ${path} HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nauthorization: Bearer ${h.adminKey}\r\n\r\n`,
    );
    await until(() => upgrading.length > seen && settingUp(), 'the upgrade under way');
    const gone = upgrading.at(-1)!;
    const closed = new Promise((resolve) => gone.once('close', resolve));
    gone.destroy();
    sock.destroy();
    await closed;
  };

  test('the live view of a paused VM leaves it paused; only the viewer input is activity; it holds a slot while open', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    await h.services.lifecycle.pause(h.admin, sb.id);
    h.services.activity.forget(sb.id);
    const ws = new WebSocket(`${url}/v1/sandboxes/${sb.id}/vnc`, { headers: { authorization: `Bearer ${h.adminKey}` } });
    const first = await new Promise<Buffer>((resolve, reject) => {
      ws.once('message', (m: Buffer) => resolve(m));
      ws.once('unexpected-response', (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
      ws.once('error', reject);
    });
    assert.equal(first.toString(), 'RFB 003.008\n');
    assert.equal((await h.store.sandboxOnly(sb.id))?.state, 'paused', 'opening the live view does not resume the VM');
    assert.equal(slotsInUse(), 1, 'an open live view holds one command slot');
    const stream = streams.at(-1)!;
    // The handshake and the screen updates a watching viewer asks for are not activity.
    for (const m of [Buffer.from('RFB 003.008\n'), Buffer.from([1]), Buffer.from([1]), Buffer.from([3, 1, 0, 0, 0, 0, 0, 64, 0, 48])]) ws.send(m);
    await until(() => stream.written.length === 4, 'the viewer bytes reach the node');
    assert.equal(h.services.activity.lastActiveMs(sb.id), undefined, 'watching is not activity');
    // A key is.
    ws.send(Buffer.from([4, 1, 0, 0, 0, 0, 0, 0x61]));
    await until(() => stream.written.length === 5, 'the key reaches the node');
    assert.ok(h.services.activity.lastActiveMs(sb.id) !== undefined, 'a key is activity');
    ws.close();
    await until(() => stream.detached && slotsInUse() === 0, 'the stream closed and the slot released');
    await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(sb.id))!);
  });

  test('live views past the tenant command limit are refused (429 naming the limit)', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const limit = h.services.slots.limits.execsPerTenant;
    const open: WebSocket[] = [];
    try {
      for (let i = 0; i < limit; i++) {
        const ws = new WebSocket(`${url}/v1/sandboxes/${sb.id}/vnc`, { headers: { authorization: `Bearer ${h.adminKey}` } });
        open.push(ws);
        await new Promise((resolve, reject) => {
          ws.once('open', resolve);
          ws.once('error', reject);
        });
      }
      const refused = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const ws = new WebSocket(`${url}/v1/sandboxes/${sb.id}/vnc`, { headers: { authorization: `Bearer ${h.adminKey}` } });
        ws.once('unexpected-response', (_req, res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        ws.once('open', () => reject(new Error('one view past the limit was let in')));
      });
      assert.equal(refused.status, 429);
      const error = (JSON.parse(refused.body) as { error: { code: string; limit: string } }).error;
      assert.deepEqual([error.code, error.limit], ['LIMIT_EXCEEDED', 'execsPerTenant']);
    } finally {
      for (const ws of open) ws.close();
    }
    await until(() => slotsInUse() === 0, 'every slot released');
    await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(sb.id))!);
  });

  test('a client gone while its route is set up leaves no VNC stream open and no command slot taken', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    // VNC: the node's connection comes only after the client has gone.
    let open!: () => void;
    let connecting = 0;
    gate = new Promise((resolve) => (open = resolve));
    const screenConnect = h.edge.screen.connect.bind(h.edge.screen);
    h.edge.screen.connect = (...args) => {
      connecting++;
      return screenConnect(...args);
    };
    const before = streams.length;
    try {
      await upgradeAndGo(`/v1/sandboxes/${sb.id}/vnc`, () => connecting === 1);
      open();
      await until(() => streams.length === before + 1, 'the node connection made');
      await until(() => streams.at(-1)!.detached, 'the VNC stream of a client gone closed');
      await until(() => slotsInUse() === 0, 'its slot released');
    } finally {
      gate = Promise.resolve();
      h.edge.screen.connect = screenConnect;
    }

    // Exec: the route resolves only after the client has gone.
    const lifecycle = h.services.lifecycle;
    const route = lifecycle.route.bind(lifecycle);
    let routed!: () => void;
    const held = new Promise<void>((resolve) => (routed = resolve));
    let routing = 0;
    lifecycle.route = async (...args) => {
      routing++;
      await held;
      return route(...args);
    };
    try {
      await upgradeAndGo(`/v1/sandboxes/${sb.id}/exec/ws`, () => routing === 1);
      routed();
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(slotsInUse(), 0, 'no exec slot is left taken by a client gone');
    } finally {
      lifecycle.route = route;
    }
    await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(sb.id))!);
  });
});

describe('carriesInput', () => {
  test('keys, the pointer, the clipboard and QEMU messages are input; the handshake and update requests are not', () => {
    assert.equal(carriesInput(Buffer.from([4, 1, 0, 0, 0, 0, 0, 0x61])), true, 'KeyEvent');
    assert.equal(carriesInput(Buffer.from([5, 0, 0, 10, 0, 20])), true, 'PointerEvent');
    assert.equal(carriesInput(Buffer.from([6, 0, 0, 0, 0, 0, 0, 1, 0x61])), true, 'ClientCutText');
    assert.equal(carriesInput(Buffer.from([255, 0, 0, 1])), true, 'QEMU extended key');
    const update = [3, 1, 0, 0, 0, 0, 4, 0, 3, 0];
    const encodings = [2, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7];
    assert.equal(carriesInput(Buffer.from(update)), false, 'FramebufferUpdateRequest');
    assert.equal(carriesInput(Buffer.from([...encodings, ...update, ...update])), false, 'SetEncodings and updates');
    assert.equal(carriesInput(Buffer.from([...update, ...encodings, 5, 0, 0, 1, 0, 1])), true, 'a pointer event after updates');
    assert.equal(carriesInput(Buffer.from([0, ...Array<number>(19).fill(0), ...update])), false, 'SetPixelFormat');
    assert.equal(carriesInput(Buffer.from('RFB 003.008\n')), false, 'the version');
    assert.equal(carriesInput(Buffer.from([1])), false, 'security type None, shared ClientInit');
    assert.equal(carriesInput(Buffer.from([0])), false, 'exclusive ClientInit');
  });
});
