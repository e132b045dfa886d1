// A TCP relay that adds a one-way delay to every byte in each direction (and one round trip to a
// new connection, its handshake), for a shaped link on this kernel, which has no netem (the
// link's rate is a tbf qdisc on its veth pair). Unlike a relay that pauses its source for each
// chunk, it keeps data in flight during the delay (a queue of chunks, each sent when due), so the
// delay does not cap the rate: up to MAX_QUEUED_BYTES per direction wait at once, past that the
// source is paused. Timers fire no sooner than 1 ms here, so a delay under 1 ms is at least 1 ms
// on a loaded machine (the bench measures the round trip it got and reports it). The `lazy`
// scenario runs it as a process in its namespace; the `install` scenario's registry child
// (npm-registry-child.ts) calls startDelayRelay.
// Usage: node delay-relay.js <listen address> <listen port> <upstream address> <upstream port> <one-way delay µs>
import net from 'node:net';

/** Bytes in the delay line of one direction before its source is paused. */
const MAX_QUEUED_BYTES = 8 * 1024 * 1024;

/** Passes `from`'s data to `to` `delayMs` later, in order, with backpressure past MAX_QUEUED_BYTES. */
function delayed(from: net.Socket, to: net.Socket, delayMs: number): void {
  const queue: { due: number; chunk: Buffer | null }[] = [];
  let queued = 0;
  let timer: NodeJS.Timeout | undefined;
  let blocked = false;
  const pump = (): void => {
    timer = undefined;
    const now = performance.now();
    while (queue.length > 0 && queue[0]!.due <= now) {
      const { chunk } = queue.shift()!;
      if (to.destroyed) return;
      if (chunk === null) {
        to.end();
        return;
      }
      queued -= chunk.length;
      if (!to.write(chunk) && !blocked) {
        blocked = true;
        to.once('drain', () => {
          blocked = false;
          if (queued < MAX_QUEUED_BYTES) from.resume();
        });
      }
    }
    if (!blocked && queued < MAX_QUEUED_BYTES) from.resume();
    if (queue.length > 0) timer = setTimeout(pump, Math.max(0, queue[0]!.due - now));
  };
  const push = (chunk: Buffer | null): void => {
    queue.push({ due: performance.now() + delayMs, chunk });
    if (chunk !== null) queued += chunk.length;
    if (queued >= MAX_QUEUED_BYTES) from.pause();
    if (timer === undefined) timer = setTimeout(pump, delayMs);
  };
  from.on('data', (chunk: Buffer) => push(chunk));
  from.on('end', () => push(null));
}

/** A relay from connections to `listen` to `upstream`, every byte `delayMs` late each way (listening once returned). */
export function startDelayRelay(listen: { host: string; port: number }, upstream: { host: string; port: number }, delayMs: number): net.Server {
  return net
    .createServer({ allowHalfOpen: true, noDelay: true }, (client) => {
      client.pause();
      const up = net.connect({ host: upstream.host, port: upstream.port, allowHalfOpen: true, noDelay: true });
      const kill = (): void => {
        client.destroy();
        up.destroy();
      };
      client.on('error', kill);
      up.on('error', kill);
      client.on('close', () => up.destroy());
      up.on('close', () => client.destroy());
      // The handshake's round trip, then data each way one delay late.
      setTimeout(() => {
        delayed(client, up, delayMs);
        delayed(up, client, delayMs);
        client.resume();
      }, 2 * delayMs);
    })
    .listen(listen.port, listen.host);
}

if (process.argv[1]?.endsWith('delay-relay.js') === true) {
  const [listenAddress, listenPort, upAddress, upPort, delayArg] = process.argv.slice(2);
  if (!listenAddress || !listenPort || !upAddress || !upPort || !delayArg) {
    throw new Error('usage: delay-relay.js <listen address> <listen port> <upstream address> <upstream port> <one-way delay µs>');
  }
  startDelayRelay({ host: listenAddress, port: Number(listenPort) }, { host: upAddress, port: Number(upPort) }, Number(delayArg) / 1000).once('listening', () =>
    process.stdout.write('ready\n'),
  );
}
