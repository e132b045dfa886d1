// SandboxFusion's code execution API (bytedance/SandboxFusion; the client verl and SkyRL reward
// functions use), served by the fncall backend: `POST run_code` and `GET v1/ping` under
// `/v1/sandboxfusion/` (a dsec key in `Authorization`) and under `/v1/sandboxfusion/t/<token>/`
// (an endpoint token in the path, for clients that send no headers). Every outcome of the code,
// and every failure to run it, is HTTP 200 with SandboxFusion's body (verl scores any other
// status as an API error); a malformed request is a 400 naming the field, a bad credential 401.
import { constants as osConstants } from 'node:os';
import { z } from 'zod';
import { DsecError, MAX_CALL_MEMORY_MIB, MAX_CALL_TIMEOUT_MS } from '@dsec/protocol';
import type { CallRequest, CallResult, CallRuntime, CallStepResult } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { router } from '../http/env.js';
import type { RouterDeps } from '../http/env.js';
import { jsonBody, requestSignal } from '../http/validate.js';
import type { CallService } from '../services/calls.js';

/** Memory limit of a call that asks for none (`memory_limit_MB` -1, SandboxFusion's default). */
export const SANDBOXFUSION_DEFAULT_MEMORY_MB = 1024;

/** How each language runs: a runtime that compiles `code` itself, or a file and a command line. */
type LanguagePlan = { runtime: CallRuntime; file?: undefined } | { runtime: CallRuntime; file: string; argv: string[] };

/** The languages served, each on a fncall runtime. */
export const SANDBOXFUSION_LANGUAGES: Record<string, LanguagePlan> = {
  python: { runtime: 'python3', file: 'main.py', argv: ['python3', 'main.py'] },
  pytest: { runtime: 'python3', file: 'test_main.py', argv: ['python3', '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'test_main.py'] },
  bash: { runtime: 'bash', file: 'main.sh', argv: ['bash', 'main.sh'] },
  nodejs: { runtime: 'node', file: 'main.js', argv: ['node', 'main.js'] },
  c: { runtime: 'c' },
  cpp: { runtime: 'cpp' },
  go: { runtime: 'go' },
  java: { runtime: 'java' },
};

const relativePath = z
  .string()
  .max(1024)
  .regex(/^(?!\/)(?!.*(^|\/)\.\.?(\/|$))[^\0]+$/, 'must be a relative path without . or .. segments');
const base64 = z.string().regex(/^[A-Za-z0-9+/\r\n]*={0,2}\s*$/, 'must be base64');
const seconds = z
  .number()
  .positive()
  .max(MAX_CALL_TIMEOUT_MS / 1000);

/** SandboxFusion's RunCodeRequest (unknown fields are ignored, as its server does). */
export const RunCodeRequestSchema = z.object({
  code: z.string().max(1_048_576),
  language: z.enum(Object.keys(SANDBOXFUSION_LANGUAGES) as [string, ...string[]], {
    error: `must be one of ${Object.keys(SANDBOXFUSION_LANGUAGES).join(', ')}`,
  }),
  compile_timeout: seconds.default(10),
  run_timeout: seconds.default(10),
  memory_limit_MB: z
    .number()
    .int()
    .min(-1)
    .max(MAX_CALL_MEMORY_MIB)
    .refine((v) => v === -1 || v >= 16, 'must be -1 (no limit asked) or at least 16')
    .default(-1),
  stdin: z
    .string()
    .max(16 * 1_048_576)
    .nullable()
    .default(null),
  files: z
    .record(relativePath, base64.nullable())
    .refine((f) => Object.keys(f).length <= 256, 'at most 256 files')
    .default({}),
  fetch_files: z.array(z.string().min(1).max(1024)).max(256).default([]),
});

export type RunCodeRequest = z.output<typeof RunCodeRequestSchema>;

/** SandboxFusion's CommandRunResult (`execution_time` in seconds; `return_code` null after a time limit). */
export const CommandRunResultSchema = z.object({
  status: z.enum(['Finished', 'Error', 'TimeLimitExceeded']),
  execution_time: z.number(),
  return_code: z.number().nullable(),
  stdout: z.string(),
  stderr: z.string(),
});

export type CommandRunResult = z.infer<typeof CommandRunResultSchema>;

/** SandboxFusion's RunCodeResponse (HTTP 200 for every outcome; `files` base64). */
export const RunCodeResponseSchema = z.object({
  status: z.enum(['Success', 'Failed', 'SandboxError']),
  message: z.string(),
  compile_result: CommandRunResultSchema.nullable(),
  run_result: CommandRunResultSchema.nullable(),
  executor_pod_name: z.string().nullable(),
  files: z.record(z.string(), z.string()),
});

export type RunCodeResponse = z.infer<typeof RunCodeResponseSchema>;

/** The fncall request of a run_code request. */
export function toCallRequest(req: RunCodeRequest): CallRequest {
  const plan = SANDBOXFUSION_LANGUAGES[req.language]!;
  const files: Record<string, string> = {};
  for (const [name, content] of Object.entries(req.files)) if (content !== null) files[name] = content.replace(/\s+/g, '');
  const call: CallRequest = {
    runtime: plan.runtime,
    timeoutMs: Math.max(1, Math.round(req.run_timeout * 1000)),
    memoryMiB: req.memory_limit_MB === -1 ? SANDBOXFUSION_DEFAULT_MEMORY_MB : req.memory_limit_MB,
    fileEncoding: 'base64',
  };
  if (plan.file === undefined) {
    call.code = req.code.length > 0 ? req.code : '\n';
    call.compileTimeoutMs = Math.max(1, Math.round(req.compile_timeout * 1000));
  } else {
    files[plan.file] = Buffer.from(req.code).toString('base64');
    call.argv = plan.argv;
  }
  if (Object.keys(files).length > 0) call.files = files;
  if (req.stdin !== null) call.stdin = req.stdin;
  if (req.fetch_files.length > 0) call.fetchFiles = req.fetch_files;
  return call;
}

function commandResult(r: CallStepResult): CommandRunResult {
  const signalled = r.signal !== null ? 128 + ((osConstants.signals as Record<string, number>)[r.signal] ?? 0) : null;
  return {
    status: r.timedOut ? 'TimeLimitExceeded' : 'Finished',
    execution_time: r.durationMs / 1000,
    return_code: r.timedOut ? null : (r.exitCode ?? signalled),
    stdout: r.stdout,
    stderr: r.stderr,
  };
}

const ok = (r: CommandRunResult | null): boolean => r === null || (r.status === 'Finished' && r.return_code === 0);

/** SandboxFusion's answer for a call's result. */
export function toRunCodeResponse(result: CallResult): RunCodeResponse {
  const compile = result.compile ? commandResult(result.compile) : null;
  const run = compile !== null && !ok(compile) ? null : commandResult(result);
  return {
    status: ok(compile) && run !== null && ok(run) ? 'Success' : 'Failed',
    message: '',
    compile_result: compile,
    run_result: run,
    executor_pod_name: null,
    files: result.files ?? {},
  };
}

/** SandboxFusion's answer when the code could not be run (runtime not ready, no capacity, a limit). */
export function sandboxError(err: unknown): RunCodeResponse {
  const message = err instanceof DsecError ? `${err.code}: ${err.message}` : String(err);
  return { status: 'SandboxError', message, compile_result: null, run_result: null, executor_pod_name: null, files: {} };
}

/** Runs one run_code request. */
export async function runCode(calls: CallService, p: Principal, req: RunCodeRequest, signal?: AbortSignal): Promise<RunCodeResponse> {
  try {
    return toRunCodeResponse(await calls.run(p, toCallRequest(req), signal));
  } catch (err) {
    if (err instanceof DsecError && (err.code === 'UNAUTHENTICATED' || err.code === 'PERMISSION_DENIED' || err.code === 'INVALID_ARGUMENT')) throw err;
    return sandboxError(err);
  }
}

/** The SandboxFusion routes (mounted under /v1). */
export function sandboxFusionRoutes({ services: { calls }, metrics }: RouterDeps) {
  const r = router();
  for (const base of ['/sandboxfusion', '/sandboxfusion/t/:token']) {
    r.post(`${base}/run_code`, jsonBody(RunCodeRequestSchema), async (c) => {
      const reply = await runCode(calls, c.get('principal'), c.get('body'), requestSignal(c));
      metrics.calls++;
      return c.json(reply);
    });
    r.get(`${base}/v1/ping`, (c) => c.json('pong'));
  }
  return r;
}
