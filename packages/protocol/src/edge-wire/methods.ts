// The calls of the edge wire protocol: for each EdgeClient method, the schema of every argument
// (the serving side parses each with parseOrThrow before the edge sees it: this is a process
// boundary) and how to make the call on a real edge. Callbacks and signals never travel: the
// call frame says which exist and the serving side puts local ones in their place.
import { z } from 'zod';
import { CallBatchRequestSchema, CallRequestSchema } from '../calls.js';
import { DiffOptionsSchema, VerifyRequestSchema } from '../files.js';
import { DebianLayerRequestSchema, ImageRefSchema, VmLayerRequestSchema } from '../layers.js';
import type {
  EdgeCallOptions,
  EdgeCalls,
  EdgeClient,
  EdgeCreateItem,
  EdgeCreateResult,
  EdgeLayers,
  EdgeScreen,
  LayerBuildSource,
  OutputEvent,
  ProcessStream,
} from '../edge-client.js';
import { ScreenActionsSchema } from '../screen.js';
import { NetworkPolicySchema } from '../network.js';
import { parseOrThrow } from '../parse.js';
import { LabelsSchema } from '../common.js';
import { ExecSpecSchema, PtySchema } from '../exec.js';
import { BuildableLayerKindSchema, LayerKindSchema, LayerRefSchema } from '../layers.js';
import { PauseMemorySchema, SandboxClaimSchema, SandboxSpecSchema } from '../sandboxes.js';
import { invalidArgument } from '../errors.js';
import type { DsecError } from '../errors.js';
import { toWireError } from './values.js';

/** What the serving side gives a call besides its arguments. */
export interface CallContext {
  /** Aborted when the client cancels the call or the connection is lost; present when the caller passed a signal. */
  signal?: AbortSignal;
  /** Forwards one output event of an exec; present when the caller passed `onOutput`. */
  onOutput?: (ev: OutputEvent) => void;
  /** Forwards one progress line of a build; present when the caller passed `onProgress`. */
  onProgress?: (line: string) => void;
  /** The upload body of a layer build; present when the source had a stream. */
  upload?: AsyncIterable<Uint8Array>;
}

/** One method of the protocol: argument schemas (named, for the field of an error) and the call. */
export interface WireMethod {
  args: ReadonlyArray<readonly [name: string, schema: z.ZodType]>;
  /** Spawn and attach: the result is a ProcessStream kept open as stream `id`. */
  stream?: boolean;
  run(edge: EdgeClient, args: unknown[], ctx: CallContext): Promise<unknown>;
}

const sandboxId = z.string().min(1).max(256);
/** Creates in one createMany message at most. */
export const MAX_CREATE_MANY = 500;
const path = z.string().min(1).max(4096);
const pid = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const bytes = z.union([z.string(), z.instanceof(Uint8Array)]);
const signalName = z.union([
  z
    .string()
    .regex(/^(SIG)?[A-Z0-9+-]+$/)
    .max(16),
  z.number().int().min(1).max(64),
]);
const labels = z.strictObject({ labels: LabelsSchema.optional() });
const reason = z.string().max(1024).optional();
const streamId = z.number().int().min(0);

// The source of a build, with `upload: true` where the stream was (its bytes follow as chunks).
const BuildSourceSchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('tar'), upload: z.literal(true) }),
  z.strictObject({ type: z.literal('oci-archive'), upload: z.literal(true) }),
  z.strictObject({
    type: z.literal('debian'),
    suite: DebianLayerRequestSchema.shape.suite,
    packages: DebianLayerRequestSchema.shape.packages,
    variant: z.enum(['minbase', 'apt']).optional(),
  }),
  z.strictObject({ type: z.literal('busybox') }),
  z.strictObject({ type: z.literal('image'), ref: ImageRefSchema }),
  z.strictObject({
    type: z.literal('vm'),
    suite: VmLayerRequestSchema.shape.suite,
    packages: VmLayerRequestSchema.shape.packages,
    desktop: VmLayerRequestSchema.shape.desktop,
  }),
  z.strictObject({ type: z.literal('disk'), upload: z.literal(true) }),
]);
const BuildOptionsSchema = z.strictObject({
  kind: BuildableLayerKindSchema,
  name: z.string().min(1).max(256).optional(),
  labels: LabelsSchema.optional(),
  machineCache: z.boolean().optional(),
});

type Args = unknown[];
/** Argument `i`, already parsed with its schema: typed by the parameter it is passed to. */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- inferred from where the argument goes
const a = <T>(args: Args, i: number): T => args[i] as T;
/** Options with the local signal added when the caller had one. */
const withSignal = <T extends object>(opts: T | undefined, ctx: CallContext): T => ({ ...(opts ?? ({} as T)), ...(ctx.signal ? { signal: ctx.signal } : {}) });
/** The trailing call options of a method whose other arguments hold none: the local signal, if any. */
const local = (ctx: CallContext): EdgeCallOptions => withSignal<EdgeCallOptions>(undefined, ctx);

/**
 * The name of every call of EdgeClient (`layers.` and `calls.` for the sub-objects): a method
 * added to the interface does not compile until it has its entry in {@link WIRE_METHODS}.
 */
export type WireMethodName =
  | Exclude<keyof EdgeClient, 'nodeName' | 'capacity' | 'onEvent' | 'layers' | 'calls' | 'screen'>
  | `layers.${keyof EdgeLayers}`
  | `calls.${keyof EdgeCalls}`
  | `screen.${keyof EdgeScreen}`;

/** Every call a client may make, by method name. */
export const WIRE_METHODS: Readonly<Record<WireMethodName, WireMethod>> = {
  create: {
    args: [
      ['spec', SandboxSpecSchema],
      ['opts', z.strictObject({ id: sandboxId.optional() }).optional()],
    ],
    run: (e, x, ctx) => e.create(a(x, 0), withSignal(a(x, 1), ctx)),
  },
  // Many creates in one message (edge wire version 2): each item's outcome, in order; an edge
  // without createMany runs create for each item, all at once.
  createMany: {
    args: [
      [
        'items',
        z
          .array(z.strictObject({ spec: SandboxSpecSchema, id: sandboxId }))
          .min(1)
          .max(MAX_CREATE_MANY),
      ],
      ['opts', z.strictObject({}).optional()],
    ],
    run: async (e, x, ctx) => {
      const items = a<EdgeCreateItem[]>(x, 0);
      const opts = local(ctx);
      const results: EdgeCreateResult[] = e.createMany
        ? await e.createMany(items, opts)
        : await Promise.all(
            items.map((it) =>
              e.create(it.spec, { ...opts, id: it.id }).then(
                (sandbox) => ({ sandbox }),
                (err: unknown) => ({ error: err as DsecError }),
              ),
            ),
          );
      return results.map((r) => ('sandbox' in r ? r : { error: toWireError(r.error) }));
    },
  },
  claim: {
    args: [
      ['id', sandboxId],
      ['claim', SandboxClaimSchema],
    ],
    run: (e, x, ctx) => e.claim(a(x, 0), a(x, 1), local(ctx)),
  },
  destroy: { args: [['id', sandboxId]], run: (e, x, ctx) => e.destroy(a(x, 0), local(ctx)) },
  list: { args: [], run: (e) => e.list() },
  stats: { args: [['id', sandboxId]], run: (e, x, ctx) => e.stats(a(x, 0), local(ctx)) },
  pause: {
    args: [
      ['id', sandboxId],
      ['opts', z.strictObject({ reason, memory: PauseMemorySchema.optional() }).optional()],
    ],
    run: (e, x, ctx) => e.pause(a(x, 0), withSignal(a(x, 1), ctx)),
  },
  resume: {
    args: [
      ['id', sandboxId],
      ['opts', z.strictObject({ reason, prefetch: z.boolean().optional() }).optional()],
    ],
    run: (e, x, ctx) => e.resume(a(x, 0), withSignal(a(x, 1), ctx)),
  },
  snapshot: {
    args: [
      ['id', sandboxId],
      ['opts', labels.optional()],
    ],
    run: (e, x, ctx) => e.snapshot(a(x, 0), withSignal(a(x, 1), ctx)),
  },
  diff: {
    args: [
      ['id', sandboxId],
      ['opts', DiffOptionsSchema],
    ],
    run: (e, x, ctx) => e.diff(a(x, 0), a(x, 1), local(ctx)),
  },
  verify: {
    args: [
      ['id', sandboxId],
      ['req', VerifyRequestSchema],
    ],
    run: (e, x, ctx) => e.verify(a(x, 0), a(x, 1), local(ctx)),
  },
  usage: { args: [], run: (e, _x, ctx) => e.usage(local(ctx)) },
  collectGarbage: { args: [['opts', z.strictObject({ calls: z.boolean().optional() }).optional()]], run: (e, x) => e.collectGarbage(a(x, 0)) },

  exec: {
    args: [
      ['id', sandboxId],
      ['spec', ExecSpecSchema],
      ['opts', z.strictObject({ maxOutputBytes: z.number().int().min(0).optional() }).optional()],
    ],
    run: (e, x, ctx) => e.exec(a(x, 0), a(x, 1), { ...withSignal(a(x, 2), ctx), ...(ctx.onOutput ? { onOutput: ctx.onOutput } : {}) }),
  },
  spawn: {
    args: [
      ['id', sandboxId],
      ['spec', ExecSpecSchema],
    ],
    stream: true,
    run: (e, x, ctx) => e.spawn(a(x, 0), a(x, 1), local(ctx)),
  },
  processes: { args: [['id', sandboxId]], run: (e, x, ctx) => e.processes(a(x, 0), local(ctx)) },
  attach: {
    args: [
      ['id', sandboxId],
      ['pid', pid],
      ['from', z.strictObject({ stdout: z.number().int().min(0).optional(), stderr: z.number().int().min(0).optional() }).optional()],
    ],
    stream: true,
    run: (e, x, ctx) => e.attach(a(x, 0), a(x, 1), a(x, 2), local(ctx)),
  },
  writeStdin: {
    args: [
      ['id', sandboxId],
      ['pid', pid],
      ['data', bytes],
      ['eof', z.boolean().optional()],
    ],
    run: (e, x, ctx) => e.writeStdin(a(x, 0), a(x, 1), a(x, 2), a(x, 3), local(ctx)),
  },
  signal: {
    args: [
      ['id', sandboxId],
      ['pid', pid],
      ['signal', signalName],
    ],
    run: (e, x, ctx) => e.signal(a(x, 0), a(x, 1), a(x, 2), local(ctx)),
  },
  resize: {
    args: [
      ['id', sandboxId],
      ['pid', pid],
      ['rows', PtySchema.shape.rows],
      ['cols', PtySchema.shape.cols],
    ],
    run: (e, x, ctx) => e.resize(a(x, 0), a(x, 1), a(x, 2), a(x, 3), local(ctx)),
  },

  readFile: {
    args: [
      ['id', sandboxId],
      ['path', path],
      ['opts', z.strictObject({ offset: z.number().int().min(0).optional(), length: z.number().int().min(0).optional() }).optional()],
    ],
    run: (e, x, ctx) => e.readFile(a(x, 0), a(x, 1), withSignal(a(x, 2), ctx)),
  },
  writeFile: {
    args: [
      ['id', sandboxId],
      ['path', path],
      ['data', bytes],
      ['opts', z.strictObject({ mode: z.number().int().min(0).max(0o7777).optional(), append: z.boolean().optional() }).optional()],
    ],
    run: (e, x, ctx) => e.writeFile(a(x, 0), a(x, 1), a(x, 2), withSignal(a(x, 3), ctx)),
  },
  listDir: {
    args: [
      ['id', sandboxId],
      ['path', path],
    ],
    run: (e, x, ctx) => e.listDir(a(x, 0), a(x, 1), local(ctx)),
  },
  xattrs: {
    args: [
      ['id', sandboxId],
      ['paths', z.array(path).max(10_000)],
      ['prefix', z.string().max(63)],
      ['opts', z.strictObject({ replace: z.record(z.string().max(255), z.string().max(65_536)).optional() }).optional()],
    ],
    run: (e, x, ctx) => e.xattrs(a(x, 0), a(x, 1), a(x, 2), withSignal(a(x, 3), ctx)),
  },
  stat: {
    args: [
      ['id', sandboxId],
      ['path', path],
    ],
    run: (e, x, ctx) => e.stat(a(x, 0), a(x, 1), local(ctx)),
  },
  mkdir: {
    args: [
      ['id', sandboxId],
      ['path', path],
    ],
    run: (e, x, ctx) => e.mkdir(a(x, 0), a(x, 1), local(ctx)),
  },
  remove: {
    args: [
      ['id', sandboxId],
      ['path', path],
      ['opts', z.strictObject({ recursive: z.boolean().optional() }).optional()],
    ],
    run: (e, x, ctx) => e.remove(a(x, 0), a(x, 1), withSignal(a(x, 2), ctx)),
  },
  rename: {
    args: [
      ['id', sandboxId],
      ['from', path],
      ['to', path],
    ],
    run: (e, x, ctx) => e.rename(a(x, 0), a(x, 1), a(x, 2), local(ctx)),
  },
  symlink: {
    args: [
      ['id', sandboxId],
      ['path', path],
      ['target', z.string().min(1).max(4096)],
    ],
    run: (e, x, ctx) => e.symlink(a(x, 0), a(x, 1), a(x, 2), local(ctx)),
  },

  setNetwork: {
    args: [
      ['id', sandboxId],
      ['policy', NetworkPolicySchema],
    ],
    run: (e, x, ctx) => e.setNetwork(a(x, 0), a(x, 1), local(ctx)),
  },
  networkInfo: { args: [['id', sandboxId]], run: (e, x, ctx) => e.networkInfo(a(x, 0), local(ctx)) },
  networkLog: {
    args: [
      ['id', sandboxId],
      ['limit', z.number().int().min(1).max(100_000)],
    ],
    run: (e, x, ctx) => e.networkLog(a(x, 0), a(x, 1), local(ctx)),
  },

  'layers.cacheStats': { args: [], run: (e) => e.layers.cacheStats?.() ?? Promise.resolve(null) },
  'layers.resolve': { args: [['ref', LayerRefSchema]], run: (e, x) => e.layers.resolve(a(x, 0)) },
  'layers.list': { args: [['filter', z.strictObject({ kind: LayerKindSchema.optional() }).optional()]], run: (e, x) => e.layers.list(a(x, 0)) },
  'layers.build': {
    args: [
      ['source', BuildSourceSchema],
      ['opts', BuildOptionsSchema],
    ],
    run: (e, x, ctx) => {
      const src = a<z.infer<typeof BuildSourceSchema>>(x, 0);
      let source: LayerBuildSource;
      if (src.type === 'tar' || src.type === 'oci-archive' || src.type === 'disk') {
        if (!ctx.upload) throw invalidArgument('source', 'the upload is missing');
        source = { type: src.type, stream: ctx.upload };
      } else source = src as LayerBuildSource;
      return e.layers.build(source, { ...withSignal(a(x, 1), ctx), ...(ctx.onProgress ? { onProgress: ctx.onProgress } : {}) });
    },
  },
  'layers.remove': { args: [['ref', LayerRefSchema]], run: (e, x) => e.layers.remove(a(x, 0)) },
  'layers.readDisk': {
    args: [
      ['ref', LayerRefSchema],
      [
        'opts',
        z.strictObject({
          format: z.enum(['raw', 'qcow2']),
          offset: z.number().int().min(0),
          length: z
            .number()
            .int()
            .min(1)
            .max(8 * 1024 * 1024),
        }),
      ],
    ],
    run: (e, x) => {
      if (!e.layers.readDisk) throw invalidArgument('ref', 'this node exports no disk images');
      return e.layers.readDisk(a(x, 0), a(x, 1));
    },
  },
  'calls.run': { args: [['req', CallRequestSchema]], run: (e, x, ctx) => e.calls.run(a(x, 0), local(ctx)) },
  'calls.runBatch': { args: [['req', CallBatchRequestSchema]], run: (e, x, ctx) => e.calls.runBatch(a(x, 0), local(ctx)) },
  'screen.capture': { args: [['id', sandboxId]], run: (e, x, ctx) => e.screen.capture(a(x, 0), local(ctx)) },
  'screen.input': {
    args: [
      ['id', sandboxId],
      ['actions', ScreenActionsSchema],
    ],
    run: (e, x, ctx) => e.screen.input(a(x, 0), a(x, 1), local(ctx)),
  },
  // The VNC connection travels as a process stream (server bytes as output, viewer bytes as stdin).
  'screen.connect': { args: [['id', sandboxId]], stream: true, run: (e, x, ctx) => e.screen.connect(a(x, 0), local(ctx)) },
};

/** A call on an open process stream: one per method of ProcessStream that acts. */
export type StreamMethodName = `process.${Exclude<keyof ProcessStream, 'pid' | 'osPid' | 'exited' | 'onDetach' | typeof Symbol.asyncIterator>}`;

/** Calls on an open process stream; the first argument is the stream's id (its spawn or attach call). */
export const STREAM_METHODS: Readonly<
  Record<StreamMethodName, { args: ReadonlyArray<readonly [string, z.ZodType]>; run(s: ProcessStream, args: unknown[]): Promise<void> }>
> = {
  'process.write': {
    args: [
      ['stream', streamId],
      ['data', bytes],
      ['eof', z.boolean().optional()],
    ],
    run: (s, x) => s.write(a(x, 1), a(x, 2)),
  },
  'process.closeStdin': { args: [['stream', streamId]], run: (s) => s.closeStdin() },
  'process.kill': {
    args: [
      ['stream', streamId],
      ['signal', signalName.optional()],
    ],
    run: (s, x) => s.kill(a(x, 1)),
  },
  'process.detach': { args: [['stream', streamId]], run: (s) => s.detach() },
};

/** The subscription to the node's events (`onEvent`): a call that never replies until cancelled. */
export const SUBSCRIBE_METHOD = 'onEvent';

/**
 * Parses a call's arguments with their schemas; INVALID_ARGUMENT names the argument and field
 * (`spec.image.base`). Missing trailing arguments are `undefined` (optional ones accept that).
 */
export function parseArgs(method: string, schemas: ReadonlyArray<readonly [string, z.ZodType]>, args: unknown[]): unknown[] {
  if (args.length > schemas.length) throw invalidArgument('args', `${method} takes at most ${schemas.length} arguments`);
  return schemas.map(([name, schema], i) => parseOrThrow(schema, args[i], name));
}
