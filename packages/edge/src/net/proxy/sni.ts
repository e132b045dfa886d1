// Reads a TLS ClientHello from the start of a connection and finds its server name (SNI), without
// terminating TLS: the bytes read are replayed to the upstream unchanged, so the client's
// handshake runs end to end with the real server.
import type { Socket } from 'node:net';

/** Most bytes read while waiting for a complete ClientHello (post-quantum key shares make them ~2 KiB). */
export const MAX_CLIENT_HELLO_BYTES = 64 * 1024;
/** How long a client may take to send its ClientHello. */
export const CLIENT_HELLO_TIMEOUT_MS = 10_000;

const RECORD_HANDSHAKE = 0x16;
const HANDSHAKE_CLIENT_HELLO = 0x01;
const EXT_SERVER_NAME = 0x0000;
const SNI_HOST_NAME = 0x00;

/** Outcome of parsing the bytes read so far. */
export type ClientHelloParse = { state: 'incomplete' } | { state: 'done'; serverName: string | undefined } | { state: 'invalid'; reason: string };

/**
 * Parses a ClientHello that may span several handshake records. `serverName` is the first
 * host_name entry of the server_name extension (undefined when the client sent none).
 */
export function parseClientHello(buf: Buffer): ClientHelloParse {
  // Reassemble the handshake message from consecutive records.
  const parts: Buffer[] = [];
  let have = 0;
  let need = -1;
  let off = 0;
  while (need < 0 || have < need) {
    if (buf.length < off + 5) return { state: 'incomplete' };
    if (buf[off] !== RECORD_HANDSHAKE) return { state: 'invalid', reason: 'not a TLS handshake record' };
    if (buf[off + 1] !== 0x03) return { state: 'invalid', reason: 'unsupported record version' };
    const len = buf.readUInt16BE(off + 3);
    if (len === 0) return { state: 'invalid', reason: 'empty handshake record' };
    if (buf.length < off + 5 + len) return { state: 'incomplete' };
    parts.push(buf.subarray(off + 5, off + 5 + len));
    have += len;
    off += 5 + len;
    if (need < 0 && have >= 4) {
      const hs = Buffer.concat(parts);
      if (hs[0] !== HANDSHAKE_CLIENT_HELLO) return { state: 'invalid', reason: 'first handshake message is not a ClientHello' };
      need = 4 + hs.readUIntBE(1, 3);
      if (need > MAX_CLIENT_HELLO_BYTES) return { state: 'invalid', reason: 'ClientHello too large' };
    }
  }
  const hello = Buffer.concat(parts).subarray(4, need);
  try {
    return { state: 'done', serverName: serverNameOf(hello) };
  } catch (err) {
    return { state: 'invalid', reason: (err as Error).message };
  }
}

/** A bounds-checked reader over a buffer. */
class Reader {
  private off = 0;
  constructor(private readonly buf: Buffer) {}
  private need(n: number): void {
    if (this.off + n > this.buf.length) throw new Error('truncated ClientHello');
  }
  u8(): number {
    this.need(1);
    return this.buf[this.off++]!;
  }
  u16(): number {
    this.need(2);
    const v = this.buf.readUInt16BE(this.off);
    this.off += 2;
    return v;
  }
  bytes(n: number): Buffer {
    this.need(n);
    const v = this.buf.subarray(this.off, this.off + n);
    this.off += n;
    return v;
  }
  get remaining(): number {
    return this.buf.length - this.off;
  }
}

function serverNameOf(hello: Buffer): string | undefined {
  const r = new Reader(hello);
  r.bytes(2 + 32); // client_version, random
  r.bytes(r.u8()); // session_id
  r.bytes(r.u16()); // cipher_suites
  r.bytes(r.u8()); // compression_methods
  if (r.remaining === 0) return undefined; // no extensions at all
  const exts = new Reader(r.bytes(r.u16()));
  while (exts.remaining > 0) {
    const type = exts.u16();
    const data = exts.bytes(exts.u16());
    if (type !== EXT_SERVER_NAME) continue;
    const list = new Reader(data);
    const names = new Reader(list.bytes(list.u16()));
    while (names.remaining > 0) {
      const kind = names.u8();
      const name = names.bytes(names.u16());
      if (kind === SNI_HOST_NAME) return name.toString('latin1');
    }
    return undefined;
  }
  return undefined;
}

/** What {@link readClientHello} returns: the bytes consumed (to replay upstream) and the name. */
export interface ClientHelloResult {
  buffered: Buffer;
  parse: ClientHelloParse;
}

/**
 * Reads from `socket` until a complete ClientHello (or garbage, or the limits) and returns what it
 * read. The socket is left paused with no data listener, ready to be piped.
 */
export function readClientHello(socket: Socket, timeoutMs = CLIENT_HELLO_TIMEOUT_MS): Promise<ClientHelloResult> {
  return new Promise((resolve) => {
    let buffered = Buffer.alloc(0);
    const finish = (parse: ClientHelloParse): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('close', onEnd);
      socket.off('error', onEnd);
      socket.pause();
      resolve({ buffered, parse });
    };
    const onData = (chunk: Buffer): void => {
      buffered = Buffer.concat([buffered, chunk]);
      const parse = parseClientHello(buffered);
      if (parse.state !== 'incomplete') finish(parse);
      else if (buffered.length > MAX_CLIENT_HELLO_BYTES) finish({ state: 'invalid', reason: 'ClientHello too large' });
    };
    const onEnd = (): void => finish({ state: 'invalid', reason: 'connection closed before the ClientHello' });
    const timer = setTimeout(() => finish({ state: 'invalid', reason: 'no ClientHello in time' }), timeoutMs);
    socket.on('data', onData);
    socket.once('end', onEnd);
    socket.once('close', onEnd);
    socket.once('error', onEnd);
  });
}

/** A fatal TLS alert record (used to refuse a connection in a way TLS clients report clearly). */
export function tlsAlert(description: 'access_denied' | 'unrecognized_name' | 'internal_error'): Buffer {
  const code = { access_denied: 49, unrecognized_name: 112, internal_error: 80 }[description];
  return Buffer.from([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, code]);
}
