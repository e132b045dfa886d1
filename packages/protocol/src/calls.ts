// Function calls (the fncall backend): a snippet run once in a fresh sandbox, alone or in batches.
import { z } from 'zod';
import { EnvSchema } from './common.js';
import { ImageSpecSchema } from './layers.js';

/**
 * Runtimes every node offers for function calls. `sh` is busybox; the others are Debian package
 * sets the node builds in the background (docs/integrations.md): python3 (with pytest) and bash
 * share one layer, c and cpp (gcc, g++) another, then node, go and java. A call whose runtime is
 * still being built is refused at once (UNAVAILABLE, with a retry hint), never held.
 */
export const CallRuntimeSchema = z.enum(['sh', 'python3', 'node', 'bash', 'c', 'cpp', 'go', 'java']);

export type CallRuntime = z.infer<typeof CallRuntimeSchema>;

/** Default and largest time limit of one call. */
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;

export const MAX_CALL_TIMEOUT_MS = 300_000;

/** Default memory limit of one call (the whole process tree, tmpfs files included). */
export const DEFAULT_CALL_MEMORY_MIB = 256;

export const MAX_CALL_MEMORY_MIB = 8192;

/** Default and largest cap on each of stdout and stderr of one call. */
export const DEFAULT_CALL_OUTPUT_LIMIT_BYTES = 1_048_576;

export const MAX_CALL_OUTPUT_LIMIT_BYTES = 16 * 1_048_576;

/** Default time limit of the compile step of c, cpp, go and java. */
export const DEFAULT_CALL_COMPILE_TIMEOUT_MS = 30_000;

/** Most calls in one batch. */
export const MAX_CALL_BATCH = 1000;

const callFilePath = z
  .string()
  .max(1024)
  .regex(/^(?!\/)(?!.*(^|\/)\.\.?(\/|$))[^\0]+$/, 'must be a relative path without . or .. segments');

/** POST /v1/calls: run a snippet once in a fresh sandbox. */
export const CallRequestSchema = z
  .strictObject({
    /** A built-in runtime (`code` runs as `sh -c`, `python3 -c` or `node -e`). */
    runtime: CallRuntimeSchema.optional(),
    /** Any layer set instead of a runtime (`code` then runs as `/bin/sh -c`). */
    image: ImageSpecSchema.optional(),
    /**
     * Source text for the runtime: run as `sh -c`, `bash -c`, `python3 -c` or `node -e`; for c,
     * cpp, go and java written to `main.c`, `main.cpp`, `main.go` or `Main.java` under `/work`,
     * compiled (the result's `compile`), and run when that succeeded.
     */
    code: z.string().min(1).max(1_048_576).optional(),
    /** A command line instead of `code`, run in the working directory `/work`. */
    argv: z.array(z.string().max(1_048_576)).min(1).max(4096).optional(),
    /** Files written under `/work` before the call: relative path -> content (UTF-8, or base64 with `fileEncoding`). */
    files: z
      .record(callFilePath, z.string().max(16 * 1_048_576))
      .refine((f) => Object.keys(f).length <= 256, 'at most 256 files')
      .optional(),
    stdin: z
      .string()
      .max(16 * 1_048_576)
      .optional(),
    env: EnvSchema.optional(),
    /** Wall-clock limit in ms; the call's processes are killed when it elapses. */
    timeoutMs: z.number().int().min(1).max(MAX_CALL_TIMEOUT_MS).optional(),
    /** Memory limit of the call in MiB. */
    memoryMiB: z.number().int().min(16).max(MAX_CALL_MEMORY_MIB).optional(),
    /** Cap on each of stdout and stderr in bytes; past it the call is killed and `truncated` set. */
    outputLimitBytes: z.number().int().min(0).max(MAX_CALL_OUTPUT_LIMIT_BYTES).optional(),
    /** Time limit of the compile step (c, cpp, go, java with `code`), in ms. */
    compileTimeoutMs: z.number().int().min(1).max(MAX_CALL_TIMEOUT_MS).optional(),
    /** Files read back after the run (relative to `/work`, or absolute), returned in `files`; missing ones are left out. */
    fetchFiles: z
      .array(
        z
          .string()
          .min(1)
          .max(1024)
          .regex(/^[^\0]+$/),
      )
      .max(256)
      .optional(),
    /** Encoding of `files` in the request and in the result: `utf-8` (the default) or `base64`. */
    fileEncoding: z.enum(['utf-8', 'base64']).optional(),
  })
  .refine((s) => (s.runtime === undefined) !== (s.image === undefined), { error: 'give exactly one of runtime or image', path: ['runtime'] })
  .refine((s) => (s.code === undefined) !== (s.argv === undefined), { error: 'give exactly one of code or argv', path: ['code'] });

export type CallRequest = z.infer<typeof CallRequestSchema>;

/** One step of a call (the compile step of compiled runtimes). */
export const CallStepResultSchema = z.object({
  exitCode: z.number().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  durationMs: z.number(),
  truncated: z.boolean(),
  timedOut: z.boolean(),
  oomKilled: z.boolean(),
});

export type CallStepResult = z.infer<typeof CallStepResultSchema>;

/**
 * The result of one call. When a compile step did not succeed, nothing ran: `exitCode` and
 * `signal` are null, the output empty, and `compile` says why.
 */
export const CallResultSchema = z.object({
  /** Exit status, or null when killed by a signal. */
  exitCode: z.number().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  durationMs: z.number(),
  /** User plus system CPU time of the call's processes. */
  cpuMs: z.number(),
  peakMemoryKiB: z.number(),
  /** True when output past `outputLimitBytes` was dropped (the call was killed). */
  truncated: z.boolean(),
  /** True when `timeoutMs` elapsed and the call was killed. */
  timedOut: z.boolean(),
  /** True when the memory limit killed a process of the call. */
  oomKilled: z.boolean(),
  /** The compile step (c, cpp, go, java with `code`). */
  compile: CallStepResultSchema.optional(),
  /** The `fetchFiles` that exist after the run, in `fileEncoding`. */
  files: z.record(z.string(), z.string()).optional(),
});

export type CallResult = z.infer<typeof CallResultSchema>;

/** POST /v1/calls/batch */
export const CallBatchRequestSchema = z.strictObject({ calls: z.array(CallRequestSchema).min(1).max(MAX_CALL_BATCH) });

export type CallBatchRequest = z.infer<typeof CallBatchRequestSchema>;

/** One entry of a batch reply: a result, or the error that kept the call from running. */
export const CallBatchItemSchema = z.union([CallResultSchema, z.object({ error: z.object({ code: z.string(), message: z.string() }) })]);

export type CallBatchItem = z.infer<typeof CallBatchItemSchema>;

/** 200 reply of POST /v1/calls/batch: one item per call, in request order. */
export const CallBatchResultSchema = z.object({ results: z.array(CallBatchItemSchema) });

export type CallBatchResult = z.infer<typeof CallBatchResultSchema>;
