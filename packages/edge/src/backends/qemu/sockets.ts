// Unix-socket helpers of the QEMU backends: QMP's and the agents' sockets in a VM's run directory.
import net from 'node:net';
import { DsecError } from '@dsec/protocol';

/** Connects to a unix socket; UNAVAILABLE when nobody listens. */
export function connectUnix(file: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: file });
    s.once('error', (err) => reject(new DsecError('UNAVAILABLE', `sandbox agent unreachable: ${err.message}`)));
    s.once('connect', () => {
      s.removeAllListeners('error');
      resolve(s);
    });
  });
}

/** Retries `fn` every 50 ms until it succeeds, `deadline` (ms since the epoch) passes or `stop` aborts. */
export async function connectRetrying<T>(fn: () => Promise<T>, deadline: number, stop?: AbortSignal): Promise<T> {
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() >= deadline || stop?.aborted) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}
