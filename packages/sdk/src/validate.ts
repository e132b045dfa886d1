// Argument checks with the protocol's zod schemas, before anything is sent.
import { invalidArgument } from '@dsec/protocol';
import type { DsecError } from '@dsec/protocol';
import type { z } from 'zod';

/** Parses `value` with `schema`; a failure is an INVALID_ARGUMENT naming the field (`prefix.path`). */
export function validate<S extends z.ZodType>(schema: S, value: unknown, prefix = ''): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  throw toInvalidArgument(parsed.error, prefix);
}

/** The first issue of a zod error as a DsecError. */
export function toInvalidArgument(error: z.ZodError, prefix = ''): DsecError {
  const issue = error.issues[0];
  const parts = [prefix, ...(issue?.path ?? []).map(String)].filter((p) => p !== '');
  const field = parts.join('.') || prefix || 'request';
  return invalidArgument(field, issue?.message ?? 'invalid');
}

/** Strips undefined values (the schemas are strict and exactOptionalPropertyTypes is on). */
export function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** A sandbox id as the routes take it, or INVALID_ARGUMENT naming `id`. */
export function checkSandboxId(id: string): string {
  if (typeof id !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(id)) throw invalidArgument('id', 'not a sandbox id');
  return id;
}

/** A process handle, or INVALID_ARGUMENT naming `pid`. */
export function checkPid(pid: number): number {
  if (!Number.isSafeInteger(pid) || pid < 0) throw invalidArgument('pid', 'not a process handle');
  return pid;
}
