// How values cross the wire: JSON, with bytes, `undefined` and objects that look like those two
// tagged so that decoding gives back exactly what was encoded; errors as `{code, message, details}`.
import { DsecError, ERROR_STATUS } from '../errors.js';
import type { ErrorCode, ErrorDetails } from '../errors.js';

/** A value as JSON carries it. */
export type WireValue = null | boolean | number | string | WireValue[] | { [key: string]: WireValue };

/** An error as it crosses the wire: a DsecError's code, message and details. */
export interface WireError {
  code: string;
  message: string;
  details?: Record<string, WireValue>;
}

// A one-key object with one of these keys is a tag: `{$p: i}` is a Uint8Array, the frame's part
// `i` (its bytes travel raw beside the JSON); `{$b: base64}` is a Uint8Array where there are no
// parts (an error's details) or a frame has its fill of them; `{$u: 0}` is undefined (in an
// array: arguments keep their positions), `{$o: {...}}` is a plain object that happens to have
// one key named like a tag.
const PART = '$p';
const BYTES = '$b';
const UNDEFINED = '$u';
const LITERAL = '$o';
const TAGS = new Set([PART, BYTES, UNDEFINED, LITERAL]);

/** Byte parts one frame carries at most; bytes beyond travel as base64 in its text. */
export const MAX_FRAME_PARTS = 1024;
// Objects whose fields are not their meaning: JSON would turn them into `{}` and hide a bug.
const NO_WIRE_FORM: Array<abstract new (...args: never[]) => object> = [Map, Set, WeakMap, WeakSet, Promise, Error, ArrayBuffer, DataView, RegExp, AbortSignal];

/** Base64 of bytes (Buffer where there is one, btoa elsewhere). */
export function toBase64(bytes: Uint8Array): string {
  const B = (globalThis as { Buffer?: typeof Buffer }).Buffer;
  if (B) return B.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/**
 * Bytes of base64 text: a Buffer where there is one (what the in-process edge hands out, so
 * callers see the same type either way), else a Uint8Array.
 */
export function fromBase64(text: string): Uint8Array {
  const B = (globalThis as { Buffer?: typeof Buffer }).Buffer;
  if (B) return B.from(text, 'base64');
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** `bytes` as a Buffer where there is one (what the in-process edge hands out), without a copy. */
function asBuffer(bytes: Uint8Array): Uint8Array {
  const B = (globalThis as { Buffer?: typeof Buffer }).Buffer;
  return B && !(bytes instanceof B) ? B.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) : bytes;
}

/**
 * Turns a value into JSON-safe data. Functions, AbortSignals, maps, errors, symbols and bigints
 * have no wire form: the caller strips them first (a method's codec does), so meeting one is a
 * bug (throws). Other class instances travel as their own fields, as with JSON.stringify. With
 * `parts` (the frame's), bytes are appended there and referred to by index; without, base64.
 */
export function encodeValue(value: unknown, parts?: Uint8Array[]): WireValue {
  if (value === null || typeof value === 'boolean' || typeof value === 'string') return value;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new TypeError(`cannot send ${value} over the wire`);
    return value;
  }
  if (value === undefined) return { [UNDEFINED]: 0 };
  if (value instanceof Uint8Array) {
    if (parts && parts.length < MAX_FRAME_PARTS) return { [PART]: parts.push(value) - 1 };
    return { [BYTES]: toBase64(value) };
  }
  if (Array.isArray(value)) return value.map((v) => encodeValue(v, parts));
  if (typeof value === 'object' && !ArrayBuffer.isView(value) && !NO_WIRE_FORM.some((T) => value instanceof T)) {
    // As JSON.stringify would: a value's own toJSON (a Date's ISO string), else its own fields.
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function' && !isPlain(value)) return encodeValue((toJSON as () => unknown).call(value), parts);
    const out: Record<string, WireValue> = {};
    for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = encodeValue(v, parts);
    const keys = Object.keys(out);
    return keys.length === 1 && TAGS.has(keys[0] as string) ? { [LITERAL]: out } : out;
  }
  throw new TypeError(`cannot send a ${describe(value)} over the wire`);
}

/**
 * The inverse of {@link encodeValue}, with the parts of the frame the value came in. A part the
 * frame does not carry is INVALID_ARGUMENT.
 */
export function decodeValue(value: unknown, parts: readonly Uint8Array[] = []): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) return value.map((v) => decodeValue(v, parts));
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj);
  if (keys.length === 1) {
    const key = keys[0] as string;
    if (key === PART) {
      const part = typeof obj[PART] === 'number' ? parts[obj[PART]] : undefined;
      if (!part) throw new DsecError('INVALID_ARGUMENT', `bytes ${JSON.stringify(obj[PART])}: the frame carries ${parts.length} part(s)`, { field: 'frame' });
      return asBuffer(part);
    }
    if (key === BYTES && typeof obj[BYTES] === 'string') return fromBase64(obj[BYTES]);
    if (key === UNDEFINED) return undefined;
    if (key === LITERAL && isObject(obj[LITERAL])) return decodeFields(obj[LITERAL], parts);
  }
  return decodeFields(obj, parts);
}

function decodeFields(obj: Record<string, unknown>, parts: readonly Uint8Array[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) out[k] = decodeValue(v, parts);
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isPlain(v: object): boolean {
  const proto = Object.getPrototypeOf(v) as unknown;
  return proto === Object.prototype || proto === null;
}

function describe(v: unknown): string {
  if (typeof v !== 'object' || v === null) return typeof v;
  return (v as { constructor?: { name?: string } }).constructor?.name ?? 'object';
}

/** The generic message of an error that is not a DsecError (its own message stays on the serving side). */
export const INTERNAL_MESSAGE = 'internal error on the edge';

/**
 * The wire form of an error. A DsecError keeps its code, message and details; anything else
 * becomes INTERNAL with a generic message, and `log` (the serving side's) gets the real one.
 */
export function toWireError(err: unknown, log?: (line: string) => void): WireError {
  if (err instanceof DsecError) {
    const details = safeDetails(err.details);
    return details ? { code: err.code, message: err.message, details } : { code: err.code, message: err.message };
  }
  log?.(`edge-wire: internal error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  return { code: 'INTERNAL', message: INTERNAL_MESSAGE };
}

/** The DsecError a wire error stands for (an unknown code becomes INTERNAL, keeping the message). */
export function fromWireError(w: WireError): DsecError {
  const known = Object.hasOwn(ERROR_STATUS, w.code);
  const details = (w.details ? decodeValue(w.details) : {}) as ErrorDetails;
  return new DsecError(known ? (w.code as ErrorCode) : 'INTERNAL', w.message, known ? details : { ...details, code: w.code });
}

function safeDetails(details: ErrorDetails): Record<string, WireValue> | undefined {
  if (Object.keys(details).length === 0) return undefined;
  try {
    return encodeValue(details) as Record<string, WireValue>;
  } catch {
    // A detail with no wire form (a nested Error, a Buffer view of something) is dropped, not the error.
    const out: Record<string, WireValue> = {};
    for (const [k, v] of Object.entries(details)) {
      try {
        out[k] = encodeValue(v);
      } catch {
        // left out
      }
    }
    return out;
  }
}
