// Per-sandbox bandwidth: a token bucket per direction shared by all of a sandbox's connections,
// and a Transform that meters and counts the bytes of one stream through it.
import { Transform } from 'node:stream';
import type { TransformCallback } from 'node:stream';

/** Default bandwidth per sandbox and direction, bytes/s. */
export const DEFAULT_BYTES_PER_SECOND = 32 * 1024 * 1024;
/** Largest piece a Throttle passes on at once, so that one connection cannot hog a bucket. */
const MAX_SLICE_BYTES = 64 * 1024;

/** Limits of one sandbox. */
export interface SandboxLimits {
  /** Sustained rate per direction, bytes/s. */
  bytesPerSecond: number;
  /** Bucket size per direction (bytes that may pass at once after a quiet period). */
  burstBytes: number;
}

/**
 * A token bucket that may go into debt: a taker gets its bytes at once and is told how long to
 * wait before taking again, so large chunks never starve and the long-run rate holds.
 */
export class TokenBucket {
  private tokens: number;
  private last: number;

  constructor(
    private rate: number,
    private burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.tokens = burst;
    this.last = now();
  }

  /** Changes the rate and size (policy change); keeps the current balance within the new size. */
  configure(rate: number, burst: number): void {
    this.refill();
    this.rate = rate;
    this.burst = burst;
    this.tokens = Math.min(this.tokens, burst);
  }

  private refill(): void {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.rate);
    this.last = t;
  }

  /** Takes `n` bytes; returns the ms to wait before they may be sent (0: at once). */
  take(n: number): number {
    this.refill();
    this.tokens -= n;
    return this.tokens >= 0 ? 0 : (-this.tokens / this.rate) * 1000;
  }
}

/**
 * Passes bytes through at the bucket's pace and reports each piece to `count` as it leaves.
 * Backpressure reaches the source: a waiting Throttle accepts nothing more.
 */
export class Throttle extends Transform {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly bucket: TokenBucket,
    private readonly count: (bytes: number) => void,
  ) {
    super({ highWaterMark: MAX_SLICE_BYTES });
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.passSlices(chunk, 0, done);
  }

  private passSlices(chunk: Buffer, off: number, done: TransformCallback): void {
    if (off >= chunk.length) return done();
    const slice = chunk.subarray(off, off + MAX_SLICE_BYTES);
    const wait = this.bucket.take(slice.length);
    const send = (): void => {
      this.timer = undefined;
      if (this.destroyed) return;
      this.count(slice.length);
      this.push(slice);
      this.passSlices(chunk, off + slice.length, done);
    };
    if (wait <= 0) send();
    else this.timer = setTimeout(send, Math.min(wait, 60_000));
  }

  override _destroy(err: Error | null, cb: (err: Error | null) => void): void {
    if (this.timer) clearTimeout(this.timer);
    cb(err);
  }
}
