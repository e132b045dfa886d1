// The frames of the edge wire protocol: what a control plane (the client) and an edge (the
// server) send each other over one ordered, reliable duplex of frames (an HTTP/2 stream, a
// pipe). Every frame is one JSON object, with the bytes of its values beside it as raw parts;
// `t` says what it is and `id` which call it belongs to. docs/edge-wire.md describes the exchange.
import { z } from 'zod';
import type { NodeCapacity } from '../edge-client.js';
import { parseOrThrow } from '../parse.js';
import { BackendKindSchema } from '../resources.js';
import type { WireError, WireValue } from './values.js';

/** Version of the frames below; a client refuses a server that says another. */
export const EDGE_WIRE_VERSION = 3;
/** Output events a server may send on a process stream before the client grants more. */
export const STREAM_WINDOW_EVENTS = 64;
/** Upload chunks a client may send on a layer build before the server grants more. */
export const UPLOAD_WINDOW_CHUNKS = 16;
/** Largest upload chunk in one frame; larger pieces of an upload are split. */
export const MAX_UPLOAD_CHUNK_BYTES = 256 * 1024;
/** Default interval of the server's heartbeat (which carries the node's capacity). */
export const DEFAULT_HEARTBEAT_MS = 5000;

/** A frame from the client (the control plane) to the server (the edge). */
export type ClientFrame =
  /** Starts call `id`. The flags say which of the caller's callbacks and signal exist. */
  | { t: 'call'; id: number; method: string; args: WireValue[]; signal?: boolean; output?: boolean; progress?: boolean; upload?: boolean }
  /** Aborts call `id` (its AbortSignal fired) or ends subscription `id`. */
  | { t: 'cancel'; id: number }
  /** Grants `n` more output events on process stream `id`. */
  | { t: 'credit'; id: number; n: number }
  /** A piece of the upload of call `id`: the frame's one part. */
  | { t: 'chunk'; id: number }
  /** The upload of call `id` is complete, or failed on the client's side. */
  | { t: 'chunk-end'; id: number; error?: WireError };

/** A frame from the server (the edge) to the client (the control plane). */
export type ServerFrame =
  /** First frame of a connection: the node's name and capacity, and the heartbeat interval. */
  | { t: 'hello'; version: number; nodeName: string; capacity: NodeCapacity; heartbeatMs: number }
  /** Sent every heartbeat interval: the node's capacity now. */
  | { t: 'heartbeat'; capacity: NodeCapacity }
  /** Call `id` returned `value` (spawn and attach: `{pid, osPid}`, and stream `id` is open). */
  | { t: 'reply'; id: number; value: WireValue }
  /** Call `id` failed. */
  | { t: 'error'; id: number; error: WireError }
  /** One output event of exec `id` (its `onOutput`) or of process stream `id` (takes one credit). */
  | { t: 'output'; id: number; event: WireValue }
  /** How the process of stream `id` ended, or why its end is not known. */
  | { t: 'exit'; id: number; exit?: WireValue; error?: WireError }
  /** Process stream `id` ends (after its last output), with the error that ended it early. */
  | { t: 'end'; id: number; error?: WireError }
  /** A progress line of layer build `id`. */
  | { t: 'progress'; id: number; line: string }
  /** An event of subscription `id`. */
  | { t: 'event'; id: number; event: WireValue }
  /** Grants `n` more upload chunks to layer build `id`. */
  | { t: 'credit'; id: number; n: number };

const id = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const json = z.custom<WireValue>(() => true);
const wireError = z.object({ code: z.string().max(64), message: z.string(), details: z.record(z.string(), json).optional() });

const ClientFrameSchema = z.discriminatedUnion('t', [
  z.object({
    t: z.literal('call'),
    id,
    method: z.string().max(64),
    args: z.array(json).max(8),
    signal: z.boolean().optional(),
    output: z.boolean().optional(),
    progress: z.boolean().optional(),
    upload: z.boolean().optional(),
  }),
  z.object({ t: z.literal('cancel'), id }),
  z.object({ t: z.literal('credit'), id, n: z.number().int().min(1).max(1_000_000) }),
  z.object({ t: z.literal('chunk'), id }),
  z.object({ t: z.literal('chunk-end'), id, error: wireError.optional() }),
]);

const capacity = z.object({
  cpu: z.number(),
  memoryMiB: z.number(),
  sandboxes: z.number(),
  backends: z.array(BackendKindSchema),
  microvm: z.object({ accel: z.enum(['kvm', 'tcg']), bootMs: z.number() }).optional(),
  vm: z.object({ accel: z.enum(['kvm', 'tcg']), bootMs: z.number() }).optional(),
});
const ServerFrameSchema = z.discriminatedUnion('t', [
  z.object({ t: z.literal('hello'), version: z.number(), nodeName: z.string(), capacity, heartbeatMs: z.number() }),
  z.object({ t: z.literal('heartbeat'), capacity }),
  z.object({ t: z.literal('reply'), id, value: json }),
  z.object({ t: z.literal('error'), id, error: wireError }),
  z.object({ t: z.literal('output'), id, event: json }),
  z.object({ t: z.literal('exit'), id, exit: json.optional(), error: wireError.optional() }),
  z.object({ t: z.literal('end'), id, error: wireError.optional() }),
  z.object({ t: z.literal('progress'), id, line: z.string() }),
  z.object({ t: z.literal('event'), id, event: json }),
  z.object({ t: z.literal('credit'), id, n: z.number().int().min(1) }),
]);

/** The text of a frame. */
export function encodeFrame(frame: ClientFrame | ServerFrame): string {
  return JSON.stringify(frame);
}

/** A client frame from its text; INVALID_ARGUMENT naming the field when it is not one. */
export function decodeClientFrame(text: string): ClientFrame {
  return parseOrThrow(ClientFrameSchema, parseJson(text), 'frame') as ClientFrame;
}

/** A server frame from its text; INVALID_ARGUMENT naming the field when it is not one. */
export function decodeServerFrame(text: string): ServerFrame {
  return parseOrThrow(ServerFrameSchema, parseJson(text), 'frame') as ServerFrame;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}
