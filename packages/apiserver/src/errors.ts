// The one place where a thrown value becomes what a client may see: a DsecError as it is, any
// other error as INTERNAL with a generic message (its own message and stack go to the log only).
import { DsecError } from '@dsec/protocol';
import type { ItemError } from '@dsec/protocol';

/** Converts any thrown value to a DsecError; an unknown error becomes INTERNAL and is logged. */
export function toDsecError(err: unknown, log?: (line: string) => void): DsecError {
  if (err instanceof DsecError) return err;
  log?.(`internal error: ${(err as Error | undefined)?.stack ?? String(err)}`);
  return new DsecError('INTERNAL', 'internal error', {}, { cause: err });
}

/** The `{ code, message }` of an error as a client sees it in a stream or a report. */
export function publicError(err: unknown, log?: (line: string) => void): { code: string; message: string } {
  const e = toDsecError(err, log);
  return { code: e.code, message: e.message };
}

/** The body of a failed item of a batch: code, message and the error's details. */
export function itemError(err: unknown, log?: (line: string) => void): ItemError {
  return toDsecError(err, log).toJSON().error;
}
