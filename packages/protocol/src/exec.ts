// Commands and processes: what to run, how it ended, the exec stream and the WebSocket messages.
import { z } from 'zod';
import { EnvSchema } from './common.js';

/** Largest single command line (argv bytes, or a shell string). */
export const MAX_COMMAND_BYTES = 1_048_576;

/** The fields every way of running a command shares (exec, streaming exec, WebSocket). */
export const CommandFieldsSchema = z.strictObject({
  cmd: z.string().min(1).max(MAX_COMMAND_BYTES).optional(),
  argv: z.array(z.string().max(MAX_COMMAND_BYTES)).min(1).max(65_536).optional(),
  cwd: z.string().startsWith('/', 'must be absolute').max(4096).optional(),
  env: EnvSchema.optional(),
  uid: z.number().int().min(0).max(4_294_967_294).optional(),
  gid: z.number().int().min(0).max(4_294_967_294).optional(),
  timeoutMs: z.number().int().min(1).max(86_400_000).optional(),
});
/** The fields every way of running a command shares. */
export type CommandFields = z.infer<typeof CommandFieldsSchema>;

/** A terminal size. */
export const PtySchema = z.strictObject({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) });
/** A terminal size. */
export type Pty = z.infer<typeof PtySchema>;

/** Refinement: exactly one of `cmd` (a shell string) or `argv`. */
export function oneCommand(s: { cmd?: string | undefined; argv?: string[] | undefined }): boolean {
  return (s.cmd === undefined) !== (s.argv === undefined);
}

/** The message and field of {@link oneCommand}'s refusal. */
export const ONE_COMMAND = { error: 'give exactly one of cmd or argv', path: ['cmd'] };

/** One command to run in a sandbox, as edge takes it. */
export const ExecSpecSchema = CommandFieldsSchema.extend({
  stdin: z.union([z.string(), z.instanceof(Uint8Array)]).optional(),
  keepStdinOpen: z.boolean().optional(),
  pty: PtySchema.optional(),
}).refine(oneCommand, ONE_COMMAND);

/** One command to run in a sandbox. */
export type ExecSpec = z.infer<typeof ExecSpecSchema>;

/** POST /v1/sandboxes/{id}/exec */
export const ExecRequestSchema = CommandFieldsSchema.extend({
  /** Text written to stdin, then stdin is closed. */
  stdin: z
    .string()
    .max(16 * 1024 * 1024)
    .optional(),
  /** Base64 bytes written to stdin, then stdin is closed (binary-safe form of `stdin`). */
  stdinBase64: z
    .string()
    .max(22 * 1024 * 1024)
    .optional(),
})
  .refine(oneCommand, ONE_COMMAND)
  .refine((s) => s.stdin === undefined || s.stdinBase64 === undefined, { error: 'give at most one of stdin or stdinBase64', path: ['stdin'] });

export type ExecRequest = z.infer<typeof ExecRequestSchema>;

/** How a process ended. */
export const ExitInfoSchema = z.object({
  /** Exit status, or null when killed by a signal. */
  exitCode: z.number().nullable(),
  /** Signal name (`SIGKILL`) when killed by one, else null. */
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  /** True when the sandbox's memory limit killed it. */
  oomKilled: z.boolean(),
  durationMs: z.number(),
  cpuUserMs: z.number(),
  cpuSysMs: z.number(),
  peakMemoryKiB: z.number(),
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
});
/** How a process ended. */
export type ExitInfo = z.infer<typeof ExitInfoSchema>;

/** A command run to completion on a node: its exit and its collected output. */
export const ExecResultSchema = ExitInfoSchema.extend({
  stdout: z.string(),
  stderr: z.string(),
  /** True when output beyond the caller's limit was dropped. */
  truncated: z.boolean(),
});
/** A command run to completion on a node. */
export type ExecResult = z.infer<typeof ExecResultSchema>;

/** 200 reply of exec (without streaming): the result and the process's handle. */
export const ExecReplySchema = ExecResultSchema.extend({
  /** The process's handle in this sandbox (the `{pid}` of the process routes). */
  pid: z.number(),
});
/** 200 reply of exec (without streaming). */
export type ExecReply = z.infer<typeof ExecReplySchema>;

/**
 * One line of an `application/x-ndjson` exec or output stream (and one WebSocket message).
 * Output data is base64 so that any bytes pass.
 */
export const ExecEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), pid: z.number(), osPid: z.number() }),
  z.object({ type: z.literal('output'), stream: z.enum(['stdout', 'stderr']), offset: z.number(), data: z.string() }),
  z.object({ type: z.literal('gap'), stream: z.enum(['stdout', 'stderr']), offset: z.number(), bytes: z.number() }),
  ExitInfoSchema.extend({ type: z.literal('exit'), pid: z.number() }),
  z.object({ type: z.literal('error'), error: z.object({ code: z.string(), message: z.string() }) }),
]);

export type ExecEvent = z.infer<typeof ExecEventSchema>;

/** First WebSocket message of /v1/sandboxes/{id}/exec/ws: what to run. */
export const WsExecRequestSchema = CommandFieldsSchema.extend({ pty: PtySchema.optional() }).refine(oneCommand, ONE_COMMAND);
/** First WebSocket message of an exec. */
export type WsExecRequest = z.infer<typeof WsExecRequestSchema>;

/** Later WebSocket messages from the client. */
export const WsClientMessageSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stdin'), data: z.string().max(2 * 1024 * 1024) }),
  z.object({ type: z.literal('eof') }),
  z.object({ type: z.literal('resize'), rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }),
  z.object({ type: z.literal('signal'), signal: z.string().max(16) }),
]);

export type WsClientMessage = z.infer<typeof WsClientMessageSchema>;

/** A process of a sandbox. */
export const ProcessSchema = z.object({
  pid: z.number(),
  osPid: z.number(),
  argv: z.array(z.string()),
  state: z.enum(['running', 'exited']),
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
  exit: ExitInfoSchema.optional(),
});

/** A process of a sandbox: `pid` is dsec's id of it, `osPid` its process id inside the sandbox. */
export type ProcessInfo = z.infer<typeof ProcessSchema>;

/** GET /v1/sandboxes/{id}/processes/{pid}/output query. */
export const OutputQuerySchema = z.strictObject({
  from: z.coerce.number().int().min(0).optional(),
  fromStderr: z.coerce.number().int().min(0).optional(),
});
/** GET /v1/sandboxes/{id}/processes/{pid}/output query. */
export type OutputQuery = z.infer<typeof OutputQuerySchema>;

/** POST /v1/sandboxes/{id}/processes/{pid}/signal */
export const SignalRequestSchema = z.strictObject({
  signal: z
    .string()
    .regex(/^(SIG)?[A-Z0-9]+$/)
    .max(16),
});
/** POST /v1/sandboxes/{id}/processes/{pid}/signal body. */
export type SignalRequest = z.infer<typeof SignalRequestSchema>;
