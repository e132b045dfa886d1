// Launches container sandboxes through one long-running `dsec-launch --serve` per edge process
// instead of a Node child process per create. Node's spawn forks the whole edge process (page
// tables of a large heap) on the event loop's thread: ~1.5-3.5 ms of blocked loop per create,
// which also serializes concurrent creates. The server is a small static process whose fork costs
// a fraction of that; it opens the log, makes the agent's listening socket as fd 3 and runs
// exactly what a separate dsec-launch would (chronus/launch/dsec-launch.c, "--serve").
import { DsecError } from '@dsec/protocol';
import { HelperProcess } from '../../host/helper-process.js';
import type { HelperAnswer } from '../../host/helper-process.js';
import { CRUN_TIMEOUT_MS } from './crun.js';

/** One launch: where its output goes, where its agent listens, and dsec-launch's arguments. */
export interface LaunchRequest {
  /** Log file (created 0600, appended): the launcher's, crun's and the container's stdout and stderr. */
  log: string;
  /** Path of the agent's listening unix socket, made by the launcher and passed as fd 3 (empty: none, fd 3 is /dev/null). */
  socket: string;
  /** dsec-launch's arguments (`--rootfs ... -- crun ...`), without the program name. */
  args: string[];
  timeoutMs?: number;
}

/** A launch's answer: its exit status, or the errno of a fork that failed. */
type LaunchAnswer = { ended: number } | { errno: number };

/** Largest request the server takes (its MAX_REQUEST). */
const MAX_REQUEST_BYTES = 256 * 1024;

/** "E <id> <status>" (the launch ended) or "F <id> <errno>" (the server could not start it). */
function parseAnswer(line: string): HelperAnswer<LaunchAnswer> | undefined {
  const m = /^([EF]) (\d+) (\d+)$/.exec(line);
  if (!m) return undefined;
  const n = Number(m[3]);
  return { id: Number(m[2]), value: m[1] === 'E' ? { ended: n } : { errno: n } };
}

/** A frame of the server's input: length, request id, kind, body. */
function frame(id: number, kind: 'R' | 'K', body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUInt32LE(5 + body.length, 0);
  head.writeUInt32LE(id, 4);
  head.write(kind, 8);
  return Buffer.concat([head, body]);
}

/** A `dsec-launch --serve`, started on first use and again after it died. */
export class LaunchServer {
  private readonly server: HelperProcess<LaunchAnswer>;

  constructor(binary: string) {
    this.server = new HelperProcess({ name: 'dsec-launch --serve', binary, args: ['--serve'], parse: parseAnswer });
  }

  /** Runs one launch; resolves with its exit status (128 + the signal when killed). */
  async run(req: LaunchRequest): Promise<number> {
    const strings = [req.log, req.socket, ...req.args];
    if (strings.some((s) => s.includes('\0'))) throw new DsecError('INTERNAL', 'a launch argument holds a NUL byte');
    const body = Buffer.from(strings.map((s) => `${s}\0`).join(''));
    if (body.length + 5 > MAX_REQUEST_BYTES) throw new DsecError('INTERNAL', 'launch request too large');
    const id = this.server.nextId();
    // A launch that hangs is killed (the server sends SIGKILL to that child only) and answers
    // 128 + 9 like any killed one.
    const answer = await this.server.request(id, frame(id, 'R', body), {
      timeoutMs: req.timeoutMs ?? CRUN_TIMEOUT_MS,
      onTimeout: () => this.server.send(frame(id, 'K')),
    });
    if ('ended' in answer) return answer.ended;
    throw new DsecError('BACKEND_FAILED', `dsec-launch --serve: cannot start a launch (errno ${answer.errno})`);
  }

  /** The server's process id (undefined while none runs). */
  get pid(): number | undefined {
    return this.server.pid;
  }

  /** Ends the server (it exits when its input closes); launches in flight finish on their own, unanswered. */
  close(): Promise<void> {
    return this.server.close();
  }
}
