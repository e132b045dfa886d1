// The screen, mouse and keyboard of a QEMU machine: screenshots through QMP `screendump` (PNG,
// written by QEMU into its own run directory, read back and removed by the edge), input through
// QMP `input-send-event` (a USB tablet's absolute axes, buttons, the wheel and key codes), and
// the machine's VNC server on a unix socket for live viewers.
import { randomBytes } from 'node:crypto';
import { open, rm } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { DsecError, actionPoints, parseKeyChord, textChords } from '@dsec/protocol';
import type { KeyChord, ScreenAction, ScreenCapture, ScreenInputResult } from '@dsec/protocol';
import type { QmpClient } from './qmp.js';

/** Largest screenshot read back (a 4K screen as PNG is far smaller). */
export const MAX_SCREENSHOT_BYTES = 32 * 1024 * 1024;
/** Largest screen the edge accepts QEMU to report. */
const MAX_SCREEN_SIDE = 16_384;
/** The tablet's axes run 0..ABS_MAX (QEMU's INPUT_EVENT_ABS_MAX). */
const ABS_MAX = 0x7fff;
/**
 * Pause after each key press and between clicks. The guest drains QEMU's small PS/2 queue
 * (256 bytes) at its own pace; under TCG an unpaced burst of keys overflows it and loses keys.
 */
export const KEY_DELAY_MS = 8;
/** Steps of a pointer move while a button is held (a drag), so the guest sees motion. */
const DRAG_STEPS = 8;

/** One QMP input event. */
type InputEvent =
  | { type: 'abs'; data: { axis: 'x' | 'y'; value: number } }
  | { type: 'btn'; data: { down: boolean; button: 'left' | 'right' | 'middle' | 'wheel-up' | 'wheel-down' | 'wheel-left' | 'wheel-right' } }
  | { type: 'key'; data: { down: boolean; key: { type: 'qcode'; data: string } } };

/** What a backend's screen can do for one sandbox (the `screen` facet's answer). */
export interface SandboxScreen {
  /** A screenshot as PNG with the screen's size. */
  capture(signal?: AbortSignal): Promise<ScreenCapture>;
  /** Performs the actions in order; coordinates outside the screen are refused before the first is sent. */
  input(actions: readonly ScreenAction[], signal?: AbortSignal): Promise<ScreenInputResult>;
  /** A connection to the machine's VNC server (RFB 3.8). */
  connectVnc(): Promise<net.Socket>;
}

/** Options of {@link QmpScreen}. */
export interface QmpScreenOptions {
  /** The machine's QMP connection (asked for each time: a backend may reconnect). */
  qmp: () => QmpClient;
  /** A directory QEMU (its confined uid) may write into and the edge reads: the VM's run directory. */
  dumpDir: string;
  /** The VNC server's unix socket (`-vnc unix:<path>`). */
  vncSocket: string;
  /** QMP `screendump`'s device, when the machine has several displays. */
  device?: string;
}

/** Screen, mouse and keyboard of one QEMU machine over QMP. */
export class QmpScreen implements SandboxScreen {
  constructor(private readonly opts: QmpScreenOptions) {}

  async capture(signal?: AbortSignal): Promise<ScreenCapture> {
    signal?.throwIfAborted();
    const file = path.join(this.opts.dumpDir, `screen-${randomBytes(8).toString('hex')}.png`);
    try {
      await this.opts.qmp().execute('screendump', { filename: file, format: 'png', ...(this.opts.device ? { device: this.opts.device } : {}) });
      const png = await readBounded(file, MAX_SCREENSHOT_BYTES);
      const { width, height } = pngSize(png);
      return { png, width, height };
    } finally {
      await rm(file, { force: true });
    }
  }

  async input(actions: readonly ScreenAction[], signal?: AbortSignal): Promise<ScreenInputResult> {
    signal?.throwIfAborted();
    const { width, height } = await this.size();
    // The whole list is checked before anything is sent: a bad coordinate leaves the screen untouched.
    actions.forEach((a, i) => {
      for (const { field, point } of actionPoints(a)) {
        const at = `actions.${i}${field ? `.${field}` : ''}`;
        if (point.x >= width) throw new DsecError('INVALID_ARGUMENT', `${at}.x: ${point.x} is outside the screen (width ${width})`, { field: `${at}.x` });
        if (point.y >= height) throw new DsecError('INVALID_ARGUMENT', `${at}.y: ${point.y} is outside the screen (height ${height})`, { field: `${at}.y` });
      }
    });
    const abs = (x: number, y: number): InputEvent[] => [
      { type: 'abs', data: { axis: 'x', value: scale(x, width) } },
      { type: 'abs', data: { axis: 'y', value: scale(y, height) } },
    ];
    const click = async (x: number, y: number, button: 'left' | 'right' | 'middle', times = 1): Promise<void> => {
      await this.send(abs(x, y));
      for (let i = 0; i < times; i++) {
        await this.send([btn(button, true)]);
        await this.send([btn(button, false)]);
        await sleep(KEY_DELAY_MS);
      }
    };
    const drag = async (points: ReadonlyArray<{ x: number; y: number }>): Promise<void> => {
      const [first, ...rest] = points;
      if (!first) return;
      await this.send(abs(first.x, first.y));
      await this.send([btn('left', true)]);
      let from = first;
      for (const to of rest) {
        for (let s = 1; s <= DRAG_STEPS; s++) {
          await this.send(abs(Math.round(from.x + ((to.x - from.x) * s) / DRAG_STEPS), Math.round(from.y + ((to.y - from.y) * s) / DRAG_STEPS)));
          await sleep(KEY_DELAY_MS);
        }
        from = to;
      }
      await this.send([btn('left', false)]);
    };
    let performed = 0;
    for (const a of actions) {
      signal?.throwIfAborted();
      switch (a.action) {
        case 'mouse_move':
          await this.send(abs(a.x, a.y));
          break;
        case 'left_click':
          await click(a.x, a.y, 'left');
          break;
        case 'right_click':
          await click(a.x, a.y, 'right');
          break;
        case 'middle_click':
          await click(a.x, a.y, 'middle');
          break;
        case 'double_click':
          await click(a.x, a.y, 'left', 2);
          break;
        case 'triple_click':
          await click(a.x, a.y, 'left', 3);
          break;
        case 'left_click_drag':
          await drag([a.from, a.to]);
          break;
        case 'drag':
          await drag(a.path);
          break;
        case 'scroll': {
          await this.send(abs(a.x, a.y));
          const steps: Array<'wheel-up' | 'wheel-down' | 'wheel-left' | 'wheel-right'> = [
            ...Array<'wheel-up' | 'wheel-down'>(Math.abs(a.dy)).fill(a.dy > 0 ? 'wheel-down' : 'wheel-up'),
            ...Array<'wheel-left' | 'wheel-right'>(Math.abs(a.dx)).fill(a.dx > 0 ? 'wheel-right' : 'wheel-left'),
          ];
          for (const wheel of steps) {
            await this.send([btn(wheel, true)]);
            await this.send([btn(wheel, false)]);
          }
          break;
        }
        case 'key':
          await this.press(parseKeyChord(a.keys));
          break;
        case 'type': {
          const r = textChords(a.text);
          if ('badIndex' in r)
            throw new DsecError('INVALID_ARGUMENT', `actions.${performed}.text: character ${r.badIndex} has no key`, { field: `actions.${performed}.text` });
          for (const chord of r.chords) {
            signal?.throwIfAborted();
            await this.press(chord);
          }
          break;
        }
        case 'wait':
          await sleep(a.ms, undefined, signal ? { signal } : undefined);
          break;
      }
      performed++;
    }
    return { performed, width, height };
  }

  connectVnc(): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const s = net.createConnection({ path: this.opts.vncSocket });
      s.once('connect', () => {
        s.removeAllListeners('error');
        resolve(s);
      });
      s.once('error', (err) => reject(new DsecError('UNAVAILABLE', `the VNC server does not answer: ${err.message}`)));
    });
  }

  /** The screen's size now (from a screendump: QEMU 7.2 has no query of the display's mode). */
  private async size(): Promise<{ width: number; height: number }> {
    const { width, height } = await this.capture();
    return { width, height };
  }

  /** Presses the keys of a chord in order and releases them in reverse. */
  private async press(chord: KeyChord): Promise<void> {
    const key = (q: string, down: boolean): InputEvent => ({ type: 'key', data: { down, key: { type: 'qcode', data: q } } });
    await this.send(chord.map((q) => key(q, true)));
    await this.send([...chord].reverse().map((q) => key(q, false)));
    await sleep(KEY_DELAY_MS);
  }

  private async send(events: InputEvent[]): Promise<void> {
    await this.opts.qmp().execute('input-send-event', { events });
  }
}

function btn(button: 'left' | 'right' | 'middle' | 'wheel-up' | 'wheel-down' | 'wheel-left' | 'wheel-right', down: boolean): InputEvent {
  return { type: 'btn', data: { down, button } };
}

/** A pixel coordinate as the tablet's absolute axis value (0 -> 0, the last pixel -> ABS_MAX). */
function scale(px: number, size: number): number {
  return size <= 1 ? 0 : Math.round((px * ABS_MAX) / (size - 1));
}

/** Reads a file QEMU wrote, refusing one larger than `max`. */
async function readBounded(file: string, max: number): Promise<Buffer> {
  const fh = await open(file, 'r').catch((err: unknown) => {
    const e = err as NodeJS.ErrnoException;
    throw new DsecError('BACKEND_FAILED', `screendump wrote no file: ${e.code ?? e.message}`);
  });
  try {
    const { size } = await fh.stat();
    if (size > max) throw new DsecError('BACKEND_FAILED', `screendump is ${size} bytes, more than ${max}`);
    const buf = Buffer.alloc(size);
    const { bytesRead } = await fh.read(buf, 0, size, 0);
    return buf.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** Width and height from a PNG's IHDR chunk (its first). */
export function pngSize(png: Uint8Array): { width: number; height: number } {
  const b = Buffer.from(png.buffer, png.byteOffset, png.byteLength);
  if (b.length < 24 || !b.subarray(0, 8).equals(PNG_SIGNATURE) || b.toString('latin1', 12, 16) !== 'IHDR')
    throw new DsecError('BACKEND_FAILED', 'screendump is not a PNG');
  const width = b.readUInt32BE(16);
  const height = b.readUInt32BE(20);
  if (width < 1 || height < 1 || width > MAX_SCREEN_SIDE || height > MAX_SCREEN_SIDE)
    throw new DsecError('BACKEND_FAILED', `screendump has size ${width}x${height}`);
  return { width, height };
}
