// What the edge wire protocol needs of a connection, and an in-memory pair of them.

/** The byte parts of a frame, in the order its text's `{"$p": i}` values name them. */
export type FrameParts = readonly Uint8Array[];

/**
 * One end of an ordered, reliable duplex of frames, each a JSON text and its byte parts (an
 * HTTP/2 stream with length prefixes, a pipe). The protocol brings its own flow control for
 * streams; a transport only has to keep frames in order and say when it is gone.
 */
export interface Transport {
  /**
   * Sends one frame. The parts are sent as they are: the sender does not change them afterwards.
   * After close it does nothing (the sender learns of the loss from onClose). A frame larger
   * than the transport carries is refused with PAYLOAD_TOO_LARGE, nothing of it sent.
   */
  send(frame: string, parts?: FrameParts): void;
  /** Sets the receiver of incoming frames; frames that came before it are delivered to it. */
  onFrame(receiver: (frame: string, parts: FrameParts) => void): void;
  /** Called once when the connection ends: `err` says why when it was lost rather than closed. */
  onClose(listener: (err?: Error) => void): void;
  /** Closes the connection (both ends see onClose; `err` makes it a loss). */
  close(err?: Error): void;
}

/**
 * Two connected in-memory transports. Each frame's text crosses as UTF-8 bytes, decoded again on
 * the other side, and its parts as copies, delivered in order on a later microtask: nothing but
 * serialised bytes cross, as on a socket. Closing one end closes both after the frames already sent.
 */
export function loopbackTransport(): [Transport, Transport] {
  const a = new LoopbackEnd();
  const b = new LoopbackEnd();
  a.peer = b;
  b.peer = a;
  return [a, b];
}

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

class LoopbackEnd implements Transport {
  peer: LoopbackEnd | undefined;
  private receiver: ((frame: string, parts: FrameParts) => void) | undefined;
  private readonly early: Array<[string, FrameParts]> = [];
  private readonly closeListeners: Array<(err?: Error) => void> = [];
  private closed = false;

  send(frame: string, parts: FrameParts = []): void {
    if (this.closed) return;
    const bytes = encoder.encode(frame);
    const copies = parts.map((p) => new Uint8Array(p));
    const peer = this.peer;
    queueMicrotask(() => peer?.deliver(decoder.decode(bytes), copies));
  }

  onFrame(receiver: (frame: string, parts: FrameParts) => void): void {
    this.receiver = receiver;
    for (const [f, p] of this.early.splice(0)) receiver(f, p);
  }

  onClose(listener: (err?: Error) => void): void {
    if (this.closed) queueMicrotask(() => listener());
    else this.closeListeners.push(listener);
  }

  close(err?: Error): void {
    if (this.closed) return;
    this.closed = true;
    const peer = this.peer;
    queueMicrotask(() => {
      this.ended(err);
      peer?.closeFromPeer(err);
    });
  }

  private deliver(frame: string, parts: FrameParts): void {
    if (this.receiver) this.receiver(frame, parts);
    else this.early.push([frame, parts]);
  }

  private closeFromPeer(err?: Error): void {
    this.closed = true;
    this.ended(err);
  }

  private ended(err?: Error): void {
    for (const l of this.closeListeners.splice(0)) l(err);
  }
}
