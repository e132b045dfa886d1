// The E2B-facing HTTPS listener: the operator's certificate (a wildcard `*.<domain>` for the
// per-sandbox host names `<port>-<sandboxID>.<domain>`, plus the API's own name) served on an
// address of its own, with the same routes and upgrade hooks as the plain listener, so that
// E2B clients reach `https://<port>-<id>.<domain>` (getHost, envd without E2B_SANDBOX_URL).
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:https';
import type { IncomingMessage, RequestListener } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { DsecError } from '@dsec/protocol';

/** Where the HTTPS listener listens and its certificate (PEM files; the chain after the leaf). */
export interface E2bTlsOptions {
  /** Certificate chain file (PEM). */
  certFile: string;
  /** Private key file (PEM). */
  keyFile: string;
  /** `host:port` to listen on (port 0: any free one). */
  addr: string;
}

/** A running HTTPS listener. */
export interface E2bTlsListener {
  /** `https://host:port` it listens on. */
  url: string;
  close(): Promise<void>;
}

/** Idle keep-alive of a TLS connection (as the plain listener's). */
const KEEP_ALIVE_MS = 65_000;

/** Starts the HTTPS listener; a bad certificate or key file fails the start, naming the setting. */
export async function listenE2bTls(
  o: E2bTlsOptions,
  listener: RequestListener,
  upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
): Promise<E2bTlsListener> {
  const read = (file: string, field: string): Promise<Buffer> =>
    readFile(file).catch((err: unknown) => {
      throw new DsecError('INVALID_ARGUMENT', `e2b.tls.${field}: ${(err as Error).message}`, { field: `e2b.tls.${field}` });
    });
  const [cert, key] = await Promise.all([read(o.certFile, 'certFile'), read(o.keyFile, 'keyFile')]);
  let server;
  try {
    server = createServer({ cert, key }, listener);
  } catch (err) {
    throw new DsecError('INVALID_ARGUMENT', `e2b.tls: the certificate or key is not usable: ${(err as Error).message}`, { field: 'e2b.tls' });
  }
  server.keepAliveTimeout = KEEP_ALIVE_MS;
  server.on('upgrade', upgrade);
  const m = /^(.*):([0-9]{1,5})$/.exec(o.addr);
  if (!m) throw new DsecError('INVALID_ARGUMENT', `e2b.tls.addr: ${JSON.stringify(o.addr)} is not host:port`, { field: 'e2b.tls.addr' });
  const host = m[1]!.replace(/^\[(.*)\]$/, '$1');
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(m[2]), host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
