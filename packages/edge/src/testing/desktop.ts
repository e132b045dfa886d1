// Looking at the desktop image's screen (`dsec image build --vm --desktop`), for the tests and the
// benchmark that drive it: where its xterm is, pixel counts and differences in screenshots, the
// desktop shown and steady, the xterm given the keyboard focus (proved by a command typed into
// it having run), and polling with a deadline. One copy for test/vm-x11.test.ts,
// test/vm-desktop.test.ts and bench/scenarios/vm-screen.ts.
import { setTimeout as sleep } from 'node:timers/promises';
import { decodePng } from './png.js';

/** A rectangle of screen pixels. */
export interface ScreenRect {
  x: number;
  y: number;
  w: number;
  h: number;
}

/** The desktop image's xterm on the screen (its xinitrc: `-geometry 100x32+16+16`, 6x13 `fixed`). */
export const DESKTOP_XTERM: ScreenRect = { x: 16, y: 16, w: 600, h: 416 };

/** An RGB pixel test. */
export type PixelTest = (r: number, g: number, b: number) => boolean;
export const isWhite: PixelTest = (r, g, b) => r > 240 && g > 240 && b > 240;
export const isBlack: PixelTest = (r, g, b) => r < 16 && g < 16 && b < 16;

/** Pixels of a screenshot inside `rect` (clipped to the screen) that pass `test`. */
export function countPixels(png: Uint8Array, rect: ScreenRect, test: PixelTest): number {
  const { width, height, rgb } = decodePng(png);
  let n = 0;
  for (let y = Math.max(0, rect.y); y < Math.min(height, rect.y + rect.h); y++)
    for (let x = Math.max(0, rect.x); x < Math.min(width, rect.x + rect.w); x++) {
      const i = (y * width + x) * 3;
      if (test(rgb[i]!, rgb[i + 1]!, rgb[i + 2]!)) n++;
    }
  return n;
}

/** Pixels that differ between two screenshots, inside `rect` and outside it (no rect: all count as outside). */
export function diffPixels(a: Uint8Array, b: Uint8Array, rect?: ScreenRect): { inside: number; outside: number } {
  const pa = decodePng(a);
  const pb = decodePng(b);
  if (pa.width !== pb.width || pa.height !== pb.height) throw new Error(`screens of different sizes: ${pa.width}x${pa.height}, ${pb.width}x${pb.height}`);
  let inside = 0;
  let outside = 0;
  for (let y = 0; y < pa.height; y++)
    for (let x = 0; x < pa.width; x++) {
      const i = (y * pa.width + x) * 3;
      if (pa.rgb[i] === pb.rgb[i] && pa.rgb[i + 1] === pb.rgb[i + 1] && pa.rgb[i + 2] === pb.rgb[i + 2]) continue;
      if (rect && x >= rect.x && x < rect.x + rect.w && y >= rect.y && y < rect.y + rect.h) inside++;
      else outside++;
    }
  return { inside, outside };
}

/**
 * Polls `probe` every `everyMs` until it returns a value (not undefined) or `ms` pass; errors of a
 * probe are kept and named in the timeout's message.
 */
export async function pollUntil<T>(what: string, ms: number, probe: () => Promise<T | undefined>, everyMs = 1000): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`${what}: not within ${ms} ms${last ? ` (last error: ${last instanceof Error ? last.message : JSON.stringify(last)})` : ''}`);
    await sleep(everyMs);
  }
}

/** A screenshot as the SDK's `sandbox.screen.capture()` gives it. */
export interface DesktopShot {
  png: Uint8Array;
  width: number;
  height: number;
}

/** What the desktop helpers need of a sandbox (the SDK's `Sandbox` has it). */
export interface DesktopSandbox {
  screen: {
    capture(): Promise<DesktopShot>;
    click(x: number, y: number): Promise<unknown>;
    actions(actions: Array<{ action: 'type'; text: string } | { action: 'key'; keys: string }>): Promise<unknown>;
  };
  exec(argv: string[]): Promise<{ exitCode: number | null; stdout: string }>;
}

/**
 * One look for the desktop: the xterm's window white and its prompt drawn (dark glyphs, the same
 * in two screenshots a second apart). The steady screenshot, or undefined when not yet.
 */
export async function desktopShown(sb: DesktopSandbox): Promise<DesktopShot | undefined> {
  const x = DESKTOP_XTERM;
  const shot = await sb.screen.capture();
  const white = countPixels(shot.png, { x: x.x + 8, y: x.y + 40, w: x.w - 16, h: x.h - 60 }, isWhite);
  const prompt = countPixels(shot.png, x, isBlack);
  if (white < (x.w - 16) * (x.h - 60) * 0.9 || prompt < 100) return undefined;
  await sleep(1000);
  const again = await sb.screen.capture();
  return countPixels(again.png, x, isBlack) === prompt ? again : undefined;
}

/**
 * Gives the xterm the keyboard focus and proves it: a click into it (twm's focus follows the
 * pointer), then a command typed + Return that writes `file`; its contents are read back through
 * exec. Under TCG X takes the click some time after the request, and keys sent before go to the
 * root window and are lost: so the click and the command are sent again each `retryMs` until the
 * file is there (a command typed twice writes the same file). Resolves when it is.
 */
export async function focusXterm(sb: DesktopSandbox, file: string, ms: number, retryMs = 15_000): Promise<void> {
  const x = DESKTOP_XTERM;
  const deadline = Date.now() + ms;
  for (;;) {
    await sb.screen.click(x.x + x.w / 2, x.y + x.h / 2);
    // Clears whatever a lost half of an earlier try left on the line, then the command.
    await sb.screen.actions([
      { action: 'key', keys: 'ctrl+u' },
      { action: 'type', text: `echo focused > ${file}` },
      { action: 'key', keys: 'Return' },
    ]);
    const until = Math.min(deadline, Date.now() + retryMs);
    while (Date.now() < until) {
      const r = await sb.exec(['cat', file]).catch(() => undefined);
      if (r?.exitCode === 0 && r.stdout === 'focused\n') return;
      await sleep(500);
    }
    if (Date.now() >= deadline) throw new Error(`the xterm did not take typed input within ${ms} ms (${file} was not written)`);
  }
}
