// The node's screens (EdgeClient.screen): routes a screenshot, an input request or a VNC
// connection to the sandbox's backend when it has the `screen` facet, and carries a VNC
// connection as a process stream (what the edge wire already knows how to carry with credit).
import type net from 'node:net';
import { DsecError } from '@dsec/protocol';
import type {
  BackendKind,
  EdgeCallOptions,
  EdgeScreen,
  ExitInfo,
  OutputEvent,
  ProcessStream,
  SandboxState,
  ScreenAction,
  ScreenCapture,
  ScreenInputResult,
} from '@dsec/protocol';
import { untilAborted } from './abortable.js';
import type { SandboxScreen } from './backends/qemu/screen.js';
import type { Backend } from './backend.js';

/** What the screens need of the node's registry: the sandbox's backend and state (SANDBOX_NOT_FOUND when unknown). */
export type ScreenLookup = (id: string) => { backend: Backend; state: SandboxState };

/** Screens of the node's sandboxes. */
export class NodeScreens implements EdgeScreen {
  constructor(private readonly lookup: ScreenLookup) {}

  /** A screenshot; a paused VM shows its screen as it was when paused. */
  async capture(id: string, opts: EdgeCallOptions = {}): Promise<ScreenCapture> {
    opts.signal?.throwIfAborted();
    return untilAborted(this.screenOf(id, ['running', 'paused']).capture(opts.signal), opts.signal);
  }

  /** Input reaches only a running machine (a paused one would take it all at resume). */
  async input(id: string, actions: ScreenAction[], opts: EdgeCallOptions = {}): Promise<ScreenInputResult> {
    opts.signal?.throwIfAborted();
    return this.screenOf(id, ['running']).input(actions, opts.signal);
  }

  async connect(id: string, opts: EdgeCallOptions = {}): Promise<ProcessStream> {
    opts.signal?.throwIfAborted();
    const sock = await untilAborted(this.screenOf(id, ['running', 'paused']).connectVnc(), opts.signal);
    return socketStream(sock);
  }

  private screenOf(id: string, states: SandboxState[]): SandboxScreen {
    const { backend, state } = this.lookup(id);
    if (!backend.screen) throw noScreen(id, backend.kind);
    if (!states.includes(state)) throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}`, { sandboxId: id, state });
    return backend.screen.screen(id);
  }
}

function noScreen(id: string, kind: BackendKind): DsecError {
  return new DsecError('CONFLICT', `sandbox ${id} has no screen: it runs on backend ${kind}, and only backend vm has a display`, {
    sandboxId: id,
    backend: kind,
  });
}

/** Largest piece of VNC output in one event (the wire base64s each event into one frame). */
const MAX_EVENT_BYTES = 256 * 1024;

/**
 * A socket as a process stream: what the server sends is stdout (with offsets), `write` sends,
 * `detach`, `kill` and `closeStdin` close it, and the "process" exits (code 0) when it closes.
 */
export function socketStream(sock: net.Socket): ProcessStream {
  const listeners: Array<() => void> = [];
  let closed = false;
  let resolveExit!: (e: ExitInfo) => void;
  const started = Date.now();
  const exited = new Promise<ExitInfo>((r) => (resolveExit = r));
  let received = 0;
  sock.on('close', () => {
    closed = true;
    resolveExit({
      exitCode: 0,
      signal: null,
      timedOut: false,
      oomKilled: false,
      durationMs: Date.now() - started,
      cpuUserMs: 0,
      cpuSysMs: 0,
      peakMemoryKiB: 0,
      stdoutBytes: received,
      stderrBytes: 0,
    });
    for (const fn of listeners.splice(0)) fn();
  });
  sock.on('error', () => undefined);
  async function* output(): AsyncGenerator<OutputEvent> {
    try {
      // Reading the socket as an async iterable pauses it while the consumer (and its credit) lags.
      for await (const chunk of sock as AsyncIterable<Buffer>) {
        for (let at = 0; at < chunk.length; at += MAX_EVENT_BYTES) {
          const data = chunk.subarray(at, at + MAX_EVENT_BYTES);
          yield { kind: 'data', stream: 'stdout', offset: received, data };
          received += data.length;
        }
      }
    } catch {
      // A reset connection ends the stream like a close.
    } finally {
      sock.destroy();
    }
  }
  const gen = output();
  const end = async (): Promise<void> => {
    sock.destroy();
  };
  return {
    pid: 0,
    osPid: 0,
    exited,
    [Symbol.asyncIterator]: () => gen,
    write: (data) =>
      new Promise<void>((resolve, reject) => {
        if (closed || sock.destroyed) return reject(new DsecError('CONFLICT', 'the VNC connection is closed'));
        sock.write(data, (err) => (err ? reject(new DsecError('UNAVAILABLE', `VNC write: ${err.message}`)) : resolve()));
      }),
    closeStdin: end,
    kill: end,
    detach: end,
    onDetach: (fn) => (closed ? fn() : listeners.push(fn)),
  };
}
