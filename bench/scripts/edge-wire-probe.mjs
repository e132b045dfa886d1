// The edge wire protocol alone, between two processes as between a control plane and a joined
// node: HTTP/2 inside mutual TLS 1.3 on loopback with the node session's settings, the control
// plane's WireEdgeClient in this process, serveEdge in a child over a synthetic edge (exec
// answers at once; spawn yields 64 KiB chunks of zeros as they are pulled). No sandbox, no root,
// no lock: what the wire itself costs per exec round trip and per streamed byte, for one
// checkout's builds; alternate two checkouts. Usage:
// node bench/scripts/edge-wire-probe.mjs <checkout> [execs] [MiB streamed]
import { Buffer } from 'node:buffer';
import { execFileSync, fork } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { performance } from 'node:perf_hooks';

const [checkout, nArg, mibArg, role, url, dir] = process.argv.slice(2);
const p = await import(path.join(checkout, 'packages/protocol/dist/index.js'));
const CHUNK = 64 * 1024;

if (role === 'edge') {
  const zeros = Buffer.alloc(CHUNK);
  const edge = {
    nodeName: 'probe',
    capacity: () => ({ cpu: 1, memoryMiB: 1024, sandboxes: 0, backends: ['container'] }),
    onEvent: () => () => undefined,
    exec: async () => ({ exitCode: 0, signal: null, timedOut: false, oomKilled: false, durationMs: 1, stdout: '', stderr: '', truncated: false }),
    spawn: async (_id, spec) => {
      const chunks = Number(spec.argv[1]);
      let resolveExit;
      const exited = new Promise((r) => (resolveExit = r));
      return {
        pid: 1,
        osPid: 100,
        exited,
        write: async () => undefined,
        closeStdin: async () => undefined,
        kill: async () => undefined,
        detach: async () => undefined,
        onDetach: () => undefined,
        async *[Symbol.asyncIterator]() {
          for (let i = 0; i < chunks; i++) yield { kind: 'data', stream: 'stdout', offset: i * CHUNK, data: zeros };
          resolveExit({ exitCode: 0, signal: null, timedOut: false, oomKilled: false, durationMs: 1 });
        },
      };
    },
  };
  // The parent asks for this process's CPU time around each phase.
  process.on('message', () => process.send(process.cpuUsage()));
  const f = (n) => readFileSync(path.join(dir, n), 'utf8');
  const session = http2.connect(url, {
    key: f('node.key'),
    cert: f('node.crt'),
    ca: f('ca.crt'),
    checkServerIdentity: (_h, cert) => tls.checkServerIdentity('localhost', cert),
    maxSessionMemory: p.NODE_SESSION_HTTP2.maxSessionMemoryMB,
    settings: { initialWindowSize: p.NODE_SESSION_HTTP2.initialWindowSize },
  });
  session.once('connect', () => {
    session.setLocalWindowSize(p.NODE_SESSION_HTTP2.connectionWindowSize);
  });
  const req = session.request({ ':method': 'POST', ':path': '/v1/node/session', [p.EDGE_WIRE_VERSION_HEADER]: String(p.EDGE_WIRE_VERSION) });
  req.once('response', () => {
    const served = p.serveEdge(edge, (p.framedTransport ?? p.lineTransport)(req), { heartbeatMs: 0 });
    void served.closed.then(() => process.exit(0));
  });
} else {
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-wire-probe-'));
  const ssl = (...a) => execFileSync('openssl', a, { cwd: tmp, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  ssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '1', '-subj', '/CN=probe CA');
  writeFileSync(path.join(tmp, 'ext'), 'subjectAltName=DNS:localhost\n');
  for (const who of ['server', 'node']) {
    ssl('req', ...ec, '-keyout', `${who}.key`, '-out', `${who}.csr`, '-subj', `/CN=${who === 'server' ? 'localhost' : 'probe'}`);
    ssl('x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '1', '-out', `${who}.crt`, '-extfile', 'ext');
  }
  const f = (n) => readFileSync(path.join(tmp, n), 'utf8');
  const server = http2.createSecureServer({
    key: f('server.key'),
    cert: f('server.crt'),
    ca: f('ca.crt'),
    requestCert: true,
    rejectUnauthorized: true,
    minVersion: 'TLSv1.3',
    maxSessionMemory: p.NODE_SESSION_HTTP2.maxSessionMemoryMB,
    settings: { initialWindowSize: p.NODE_SESSION_HTTP2.initialWindowSize },
  });
  server.on('session', (s) =>
    s.once('connect', () => {
      s.setLocalWindowSize(p.NODE_SESSION_HTTP2.connectionWindowSize);
    }),
  );
  const connected = new Promise((resolve) =>
    server.on('stream', (stream) => {
      stream.respond({ ':status': 200 });
      resolve(p.WireEdgeClient.connect((p.framedTransport ?? p.lineTransport)(stream)));
    }),
  );
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const child = fork(new URL(import.meta.url).pathname, [checkout, '0', '0', 'edge', `https://127.0.0.1:${server.address().port}`, tmp], {
    execArgv: process.env.PROBE_EDGE_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.PROBE_EDGE_PROF}`] : [],
  });
  const client = await connected;
  const edgeCpu = () => new Promise((resolve) => (child.once('message', (c) => resolve(c.user + c.system)), child.send('cpu')));
  const ownCpu = () => {
    const c = process.cpuUsage();
    return c.user + c.system;
  };
  const n = Number(nArg ?? 3000);
  const spec = { argv: ['true'] };
  for (let i = 0; i < 200; i++)
    await client.exec('sb', spec, { signal: new globalThis.AbortController().signal, onOutput: () => undefined, maxOutputBytes: 1 << 20 });
  const lat = [];
  const c0 = process.cpuUsage();
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await client.exec('sb', spec, { signal: new globalThis.AbortController().signal, onOutput: () => undefined, maxOutputBytes: 1 << 20 });
    lat.push(performance.now() - t);
  }
  const c = process.cpuUsage(c0);
  const s0 = [ownCpu(), await edgeCpu()];
  lat.sort((a, b) => a - b);
  const mib = Number(mibArg ?? 512);
  const rates = [];
  for (let r = 0; r < 3; r++) {
    const t = performance.now();
    const s = await client.spawn('sb', { argv: ['chunks', String((mib * 2 ** 20) / CHUNK)] });
    let bytes = 0;
    for await (const ev of s) bytes += ev.data.length;
    await s.exited;
    rates.push(bytes / 1e3 / (performance.now() - t));
  }
  rates.sort((a, b) => a - b);
  const s1 = [ownCpu(), await edgeCpu()];
  const perMiB = (i) => ((s1[i] - s0[i]) / 1e3 / (3 * mib)).toFixed(2);
  console.log(
    `WIRE ${checkout} exec p10 ${lat[Math.floor(n * 0.1)].toFixed(3)} p50 ${lat[Math.floor(n * 0.5)].toFixed(3)} p90 ${lat[Math.floor(n * 0.9)].toFixed(3)} ms, control-plane cpu/exec ${((c.user + c.system) / n).toFixed(0)} us; ${mib} MiB streamed: median ${rates[1].toFixed(0)} MB/s (${rates.map((x) => x.toFixed(0)).join(', ')}), CPU ms per MiB: control plane ${perMiB(0)}, edge ${perMiB(1)}`,
  );
  client.close();
  await new Promise((r) => child.once('exit', r));
  server.close();
  rmSync(tmp, { recursive: true, force: true });
  process.exit(0);
}
