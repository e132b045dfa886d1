// A SWE-ReX bash session: one interactive bash on a pty in the sandbox (TERM=dumb, no line
// editing, no echo, no CR), so that cwd, environment, functions and aliases persist between
// commands. Each command goes as one line `eval $'<command>'` (after a `bash -n` check) and ends
// at the next prompt, which is a marker carrying `$?`: its output is exactly what it printed.
// A command that outlives its timeout keeps running until an interrupt (^C on the pty) comes.
import { StringDecoder } from 'node:string_decoder';
import type { RunningCommand } from '../services/commands.js';

/** A command longer than this goes through a file in the sandbox (a pty line holds at most 4095 bytes). */
export const MAX_INLINE_COMMAND = 2048;

/** One match of {@link BashSession.waitFor}. */
export interface SessionMatch {
  /** Output before the match (earlier prompts' markers removed). */
  before: string;
  /** Index in the patterns given; -1 for the prompt. */
  index: number;
  /** The prompt's exit status when the prompt matched. */
  exitCode: number | null;
}

/** The value of PS1 in a session's shell (bash expands `$?` when it prints it). */
export function promptOf(nonce: string): string {
  return `__DSEC_PS1_${nonce}_$?__`;
}

/** Quotes text as bash's `$'...'`. */
export function ansiQuote(text: string): string {
  let out = "$'";
  for (const ch of text) {
    const code = ch.codePointAt(0)!;
    if (ch === '\\') out += '\\\\';
    else if (ch === "'") out += "\\'";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return out + "'";
}

/** Thrown by {@link BashSession.waitFor} when the time is up. */
export class SessionTimeout extends Error {}
/** Thrown when the shell has exited. */
export class SessionGone extends Error {}

/** The reading side of a session's shell. */
export class BashSession {
  private buf = '';
  private readonly decoder = new StringDecoder('utf8');
  private notify: (() => void) | undefined;
  private ended = false;
  /** Prompts still to come for lines already sent (earlier ones are not this command's). */
  owed = 1;
  /** One operation at a time. */
  private chain: Promise<unknown> = Promise.resolve();
  private readonly reading: Promise<void>;

  constructor(
    readonly cmd: RunningCommand,
    /** Marker of this session's prompts (random). */
    readonly nonce: string,
    /** Called once when the shell has ended. */
    private readonly onEnd: () => void = () => undefined,
  ) {
    this.reading = this.read();
  }

  private get promptRe(): RegExp {
    return new RegExp(`__DSEC_PS1_${this.nonce}_(\\d+)__`);
  }

  private async read(): Promise<void> {
    try {
      for await (const ev of this.cmd.events()) {
        if (ev.type === 'output') this.buf += this.decoder.write(Buffer.from(ev.data)).replace(/\r\n/g, '\n');
        else if (ev.type === 'exit' || ev.type === 'error') break;
        this.notify?.();
      }
    } finally {
      this.ended = true;
      this.notify?.();
      this.onEnd();
    }
  }

  /** Runs `fn` after the operations before it (a session takes one command at a time). */
  serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => undefined);
    return run;
  }

  /** Whether the shell still runs. */
  get alive(): boolean {
    return !this.ended;
  }

  /** Sends text to the shell's terminal as typed. */
  async send(text: string): Promise<void> {
    if (this.ended) throw new SessionGone('the session has exited');
    await this.cmd.write(Buffer.from(text));
  }

  /**
   * Waits until one of `patterns` or this command's prompt appears in the output (the first in
   * the text wins); earlier commands' prompts are consumed on the way. `untilPrompt`: only the
   * prompt ends the wait. Throws {@link SessionTimeout} (output kept) or {@link SessionGone}.
   */
  async waitFor(patterns: RegExp[], timeoutMs: number): Promise<SessionMatch> {
    const deadline = Date.now() + timeoutMs;
    let skipped = '';
    for (;;) {
      const found = this.search(patterns);
      if (found) {
        const { at, end, index, exitCode } = found;
        const before = skipped + this.buf.slice(0, at);
        this.buf = this.buf.slice(end);
        if (index === -1) {
          this.owed = Math.max(0, this.owed - 1);
          if (this.owed > 0) {
            skipped = before;
            continue;
          }
        }
        return { before, index, exitCode };
      }
      if (this.ended) throw new SessionGone('the session has exited');
      const left = deadline - Date.now();
      if (left <= 0) {
        this.buf = skipped + this.buf;
        throw new SessionTimeout(`no prompt within ${timeoutMs} ms`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.notify = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.notify = undefined;
    }
  }

  private search(patterns: RegExp[]): { at: number; end: number; index: number; exitCode: number | null } | undefined {
    let best: { at: number; end: number; index: number; exitCode: number | null } | undefined;
    const prompt = this.promptRe.exec(this.buf);
    if (prompt) best = { at: prompt.index, end: prompt.index + prompt[0].length, index: -1, exitCode: Number(prompt[1]) };
    // Expect strings only match text before this command's prompt is owed to be the last.
    if (this.owed <= 1) {
      for (const [i, re] of patterns.entries()) {
        const m = re.exec(best ? this.buf.slice(0, best.at) : this.buf);
        if (m && (!best || m.index < best.at)) best = { at: m.index, end: m.index + m[0].length, index: i, exitCode: null };
      }
    }
    return best;
  }

  /** Output that arrived and nobody read (after an interrupt). */
  drain(): string {
    const out = this.buf.replace(new RegExp(this.promptRe.source, 'g'), '');
    this.buf = '';
    return out;
  }

  /** Ends the shell (SIGKILL to its process group) and waits for the reader. */
  async close(): Promise<void> {
    await this.cmd.kill('SIGKILL').catch(() => undefined);
    await Promise.race([this.reading, new Promise((r) => setTimeout(r, 2000).unref())]);
  }
}
