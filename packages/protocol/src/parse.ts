// The one way input from outside becomes a typed value: a schema's parse, with the first
// problem turned into INVALID_ARGUMENT naming the field (`network.allow.0.host`).
import type { z } from 'zod';
import { invalidArgument } from './errors.js';

/**
 * Parses `value` with `schema` (defaults applied) or throws INVALID_ARGUMENT naming the first
 * offending field, prefixed with `prefix` (`body`, `query`, `spec`, `calls.3`).
 */
export function parseOrThrow<S extends z.ZodType>(schema: S, value: unknown, prefix = ''): z.output<S> {
  const res = schema.safeParse(value);
  if (res.success) return res.data;
  const issue = res.error.issues[0];
  // zod reports an unknown key of a strict object at the object: name the key itself.
  const unknownKey = issue?.code === 'unrecognized_keys' ? issue.keys[0] : undefined;
  const path = [...(issue?.path ?? []).map(String), ...(unknownKey !== undefined ? [unknownKey] : [])];
  const field = [prefix, ...path].filter(Boolean).join('.');
  throw invalidArgument(field || prefix || 'body', issue?.message ?? 'invalid');
}
