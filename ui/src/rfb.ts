// A small RFB 3.8 (VNC) client for a VM's live view: security type None (the socket is already
// authenticated by its ticket), 32-bit true colour, Raw and CopyRect encodings and the
// DesktopSize pseudo-encoding; pointer and key events. It draws on a canvas.

/** What the viewer reports. */
export interface RfbCallbacks {
  onSize(width: number, height: number): void;
  onStatus(status: string): void;
}

const ENC_RAW = 0;
const ENC_COPYRECT = 1;
const ENC_DESKTOP_SIZE = -223;

/** Keysyms of the keys whose KeyboardEvent.key is a name (X11 keysymdef.h). */
const KEYSYMS: Record<string, number> = {
  Backspace: 0xff08,
  Tab: 0xff09,
  Enter: 0xff0d,
  Escape: 0xff1b,
  Delete: 0xffff,
  Home: 0xff50,
  ArrowLeft: 0xff51,
  ArrowUp: 0xff52,
  ArrowRight: 0xff53,
  ArrowDown: 0xff54,
  PageUp: 0xff55,
  PageDown: 0xff56,
  End: 0xff57,
  Insert: 0xff63,
  Shift: 0xffe1,
  Control: 0xffe3,
  Alt: 0xffe9,
  Meta: 0xffeb,
  CapsLock: 0xffe5,
  F1: 0xffbe,
  F2: 0xffbf,
  F3: 0xffc0,
  F4: 0xffc1,
  F5: 0xffc2,
  F6: 0xffc3,
  F7: 0xffc4,
  F8: 0xffc5,
  F9: 0xffc6,
  F10: 0xffc7,
  F11: 0xffc8,
  F12: 0xffc9,
};

/** The keysym of a browser key, or undefined for keys it cannot name. */
export function keysymOf(key: string): number | undefined {
  if (key in KEYSYMS) return KEYSYMS[key];
  const cp = key.codePointAt(0);
  // One character (one code point): a name such as "Dead" or "Unidentified" is none.
  if (cp === undefined || String.fromCodePoint(cp) !== key) return undefined;
  // Latin-1 keysyms are the code points; others are 0x01000000 + the code point.
  return cp < 0x100 ? cp : 0x01000000 + cp;
}

/** One RFB connection over a WebSocket, drawn on `canvas`. */
export class RfbClient {
  private readonly queue: Uint8Array[] = [];
  private queued = 0;
  private waiter: (() => void) | undefined;
  private closed = false;
  private width = 0;
  private height = 0;
  private ctx: CanvasRenderingContext2D;
  private buttons = 0;

  constructor(
    private readonly ws: WebSocket,
    private readonly canvas: HTMLCanvasElement,
    private readonly cb: RfbCallbacks,
  ) {
    this.ctx = canvas.getContext('2d')!;
    ws.binaryType = 'arraybuffer';
    ws.onmessage = (m) => {
      const chunk = new Uint8Array(m.data as ArrayBuffer);
      this.queue.push(chunk);
      this.queued += chunk.length;
      this.waiter?.();
    };
    ws.onclose = () => {
      this.closed = true;
      cb.onStatus('closed');
      this.waiter?.();
    };
    ws.onerror = () => cb.onStatus('connection failed');
    ws.onopen = () => {
      cb.onStatus('connecting…');
      this.run().catch((err: unknown) => {
        cb.onStatus(`error: ${err instanceof Error ? err.message : String(err)}`);
        ws.close();
      });
    };
  }

  /** A pointer event at canvas pixel (x, y) with the buttons of `mask` (1 left, 2 middle, 4 right, 8/16 wheel). */
  pointer(x: number, y: number, mask: number): void {
    this.buttons = mask;
    const m = new DataView(new ArrayBuffer(6));
    m.setUint8(0, 5);
    m.setUint8(1, mask);
    m.setUint16(2, Math.max(0, Math.min(this.width - 1, Math.round(x))));
    m.setUint16(4, Math.max(0, Math.min(this.height - 1, Math.round(y))));
    this.send(m.buffer);
  }

  /** One wheel step at (x, y): up (dy < 0) or down. */
  wheel(x: number, y: number, dy: number): void {
    const bit = dy < 0 ? 8 : 16;
    this.pointer(x, y, this.buttons | bit);
    this.pointer(x, y, this.buttons & ~bit);
  }

  /** A key press or release. */
  key(keysym: number, down: boolean): void {
    const m = new DataView(new ArrayBuffer(8));
    m.setUint8(0, 4);
    m.setUint8(1, down ? 1 : 0);
    m.setUint32(4, keysym);
    this.send(m.buffer);
  }

  close(): void {
    this.ws.close();
  }

  private send(data: ArrayBuffer): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(data);
  }

  /** The next `n` bytes (waits for them). */
  private async read(n: number): Promise<Uint8Array> {
    while (this.queued < n) {
      if (this.closed) throw new Error('the connection closed');
      await new Promise<void>((r) => (this.waiter = r));
      this.waiter = undefined;
    }
    const out = new Uint8Array(n);
    let at = 0;
    while (at < n) {
      const head = this.queue[0]!;
      const take = Math.min(head.length, n - at);
      out.set(head.subarray(0, take), at);
      at += take;
      if (take === head.length) this.queue.shift();
      else this.queue[0] = head.subarray(take);
    }
    this.queued -= n;
    return out;
  }

  private async u8(): Promise<number> {
    return (await this.read(1))[0]!;
  }

  private async u16(): Promise<number> {
    const b = await this.read(2);
    return (b[0]! << 8) | b[1]!;
  }

  private async u32(): Promise<number> {
    const b = await this.read(4);
    return new DataView(b.buffer).getUint32(0);
  }

  private async run(): Promise<void> {
    const version = new TextDecoder().decode(await this.read(12));
    if (!/^RFB 003\.00\d\n$/.test(version)) throw new Error(`not an RFB server (${JSON.stringify(version)})`);
    this.send(new TextEncoder().encode('RFB 003.008\n').buffer);
    const types = await this.read(await this.u8());
    if (!types.includes(1)) throw new Error('the server asks for authentication');
    this.send(new Uint8Array([1]).buffer);
    if ((await this.u32()) !== 0) throw new Error('security handshake failed');
    this.send(new Uint8Array([1]).buffer); // ClientInit: shared
    this.resize(await this.u16(), await this.u16());
    await this.read(16); // the server's pixel format: replaced below
    await this.read(await this.u32()); // its name
    // SetPixelFormat: 32 bpp, depth 24, little-endian, true colour, 8 bits each, red at 16.
    const pf = new DataView(new ArrayBuffer(20));
    pf.setUint8(0, 0);
    pf.setUint8(4, 32);
    pf.setUint8(5, 24);
    pf.setUint8(6, 0);
    pf.setUint8(7, 1);
    pf.setUint16(8, 255);
    pf.setUint16(10, 255);
    pf.setUint16(12, 255);
    pf.setUint8(14, 16);
    pf.setUint8(15, 8);
    pf.setUint8(16, 0);
    this.send(pf.buffer);
    const encodings = [ENC_COPYRECT, ENC_RAW, ENC_DESKTOP_SIZE];
    const se = new DataView(new ArrayBuffer(4 + 4 * encodings.length));
    se.setUint8(0, 2);
    se.setUint16(2, encodings.length);
    encodings.forEach((e, i) => se.setInt32(4 + 4 * i, e));
    this.send(se.buffer);
    this.cb.onStatus('connected');
    this.request(false);
    for (;;) {
      const type = await this.u8();
      if (type === 0) {
        await this.read(1);
        const rects = await this.u16();
        for (let i = 0; i < rects; i++) await this.rect();
        this.request(true);
      } else if (type === 1) {
        await this.read(3);
        await this.read((await this.u16()) * 6);
      } else if (type === 2) {
        // Bell: nothing to show.
      } else if (type === 3) {
        await this.read(3);
        await this.read(await this.u32());
      } else throw new Error(`unknown server message ${type}`);
    }
  }

  private async rect(): Promise<void> {
    const x = await this.u16();
    const y = await this.u16();
    const w = await this.u16();
    const h = await this.u16();
    const enc = (await this.u32()) | 0;
    if (enc === ENC_RAW) {
      const data = await this.read(w * h * 4);
      if (w === 0 || h === 0) return;
      const img = this.ctx.createImageData(w, h);
      for (let i = 0; i < w * h; i++) {
        // Little-endian 32 bpp with red at bit 16: bytes are B, G, R, X.
        img.data[i * 4] = data[i * 4 + 2]!;
        img.data[i * 4 + 1] = data[i * 4 + 1]!;
        img.data[i * 4 + 2] = data[i * 4]!;
        img.data[i * 4 + 3] = 255;
      }
      this.ctx.putImageData(img, x, y);
    } else if (enc === ENC_COPYRECT) {
      const sx = await this.u16();
      const sy = await this.u16();
      if (w > 0 && h > 0) this.ctx.drawImage(this.canvas, sx, sy, w, h, x, y, w, h);
    } else if (enc === ENC_DESKTOP_SIZE) {
      this.resize(w, h);
    } else throw new Error(`encoding ${enc} was not asked for`);
  }

  private resize(width: number, height: number): void {
    this.width = width;
    this.height = height;
    this.canvas.width = width;
    this.canvas.height = height;
    this.cb.onSize(width, height);
  }

  /** FramebufferUpdateRequest for the whole screen. */
  private request(incremental: boolean): void {
    const m = new DataView(new ArrayBuffer(10));
    m.setUint8(0, 3);
    m.setUint8(1, incremental ? 1 : 0);
    m.setUint16(6, this.width);
    m.setUint16(8, this.height);
    this.send(m.buffer);
  }
}
