// Image layers: upload a tar or OCI image, build from Debian packages, pull from a registry, list,
// remove.
import { open } from 'node:fs/promises';
import { Readable } from 'node:stream';
import {
  DebianLayerRequestSchema,
  DsecError,
  ERROR_STATUS,
  LayerKindSchema,
  LayerRefSchema,
  PullLayerRequestSchema,
  UploadLayerQuerySchema,
  VmLayerRequestSchema,
} from '@dsec/protocol';
import type { ErrorCode } from '@dsec/protocol';
import type { z } from 'zod';
import type { CallOptions, DsecClient } from './client.js';
import { readNdjson } from './ndjson.js';
import { packDir } from './tar.js';
import type { DebianLayerRequest, LayerInfo, LayerUploadQuery, VmLayerRequest } from './types.js';
import { validate } from './validate.js';

/** Options of a layer upload. Uploads and builds have no deadline unless `requestTimeoutMs` is given. */
export interface LayerUploadOptions extends CallOptions {
  /** Called as the body is sent, with the bytes sent so far. */
  onProgress?: (bytesSent: number) => void;
}

/** Options of a Debian layer build. */
export interface DebianBuildOptions extends CallOptions {
  /** Called with each progress line of the build (mmdebstrap's). */
  onProgress?: (message: string) => void;
}

/** What {@link LayersApi.pull} takes: `kind` defaults to `base`. */
export type PullLayerInput = z.input<typeof PullLayerRequestSchema>;

/** Image layers of the caller's project, plus the public ones. */
export class LayersApi {
  constructor(private readonly client: DsecClient) {}

  /**
   * Uploads a layer: a tar (optionally gzip) by default, or with `format: 'oci'` an OCI layout or
   * `docker save` tarball, squashed into one layer.
   */
  async upload(source: Buffer | Uint8Array | Readable | AsyncIterable<Uint8Array>, query: LayerUploadQuery, opts: LayerUploadOptions = {}): Promise<LayerInfo> {
    const q = validate(UploadLayerQuerySchema, query, 'query');
    let body = source;
    if (opts.onProgress && (Buffer.isBuffer(source) || source instanceof Uint8Array)) {
      // Send buffers as a stream of chunks so that progress is reported as they go out.
      const buf = Buffer.from(source.buffer, source.byteOffset, source.byteLength);
      body = Readable.from(chunksOf(buf, 1 << 20));
    }
    return this.client.json<LayerInfo>(
      {
        method: 'POST',
        path: '/v1/layers',
        query: { kind: q.kind, name: q.name, format: q.format },
        body,
        contentType: 'application/x-tar',
        onUploadProgress: opts.onProgress,
        timeoutMs: opts.requestTimeoutMs ?? 0,
      },
      opts,
    );
  }

  /** Uploads the content of a local directory as a layer (packed into a tar as it is sent). */
  async uploadDir(localDir: string, query: LayerUploadQuery, opts: LayerUploadOptions = {}): Promise<LayerInfo> {
    return this.upload(packDir(localDir), { ...query, format: 'tar' }, opts);
  }

  /** Builds a layer from Debian packages with mmdebstrap on the server, streaming its progress. */
  async buildDebian(req: DebianLayerRequest, opts: DebianBuildOptions = {}): Promise<LayerInfo> {
    return this.longBuild('/v1/layers/debian', validate(DebianLayerRequestSchema, req), 'debian build', opts);
  }

  /**
   * Builds a bootable VM disk image (a `disk` layer for `backend: "vm"`) on the server: Debian with
   * systemd, the QEMU guest agent and chronus, plus `packages`; streams its progress.
   */
  async buildVm(req: VmLayerRequest = {}, opts: DebianBuildOptions = {}): Promise<LayerInfo> {
    return this.longBuild('/v1/layers/vm', validate(VmLayerRequestSchema, req), 'vm image build', opts);
  }

  /**
   * Imports an OCI or Docker image from a registry the node may pull from (`host/repo:tag` or
   * `host/repo@sha256:...`), squashed into one layer (kind `base` unless given), streaming progress.
   */
  async pull(req: PullLayerInput, opts: DebianBuildOptions = {}): Promise<LayerInfo> {
    return this.longBuild('/v1/layers/pull', validate(PullLayerRequestSchema, req), 'image pull', opts);
  }

  /** A build that streams its progress as ndjson lines and ends with the layer (or an error). */
  private async longBuild(path: string, body: object, what: string, opts: DebianBuildOptions): Promise<LayerInfo> {
    const reply = await this.client.stream({ method: 'POST', path, body, accept: 'application/x-ndjson', timeoutMs: opts.requestTimeoutMs ?? 0 }, opts);
    if (!(reply.headers['content-type'] ?? '').includes('ndjson')) {
      const chunks: Buffer[] = [];
      for await (const c of reply.body) chunks.push(c as Buffer);
      return JSON.parse(Buffer.concat(chunks).toString('utf8')) as LayerInfo;
    }
    type Line = { type: 'progress'; message: string } | { type: 'layer'; layer: LayerInfo } | { type: 'error'; error: { code: string; message: string } };
    for await (const line of readNdjson<Line>(reply.body)) {
      if (line.type === 'progress') opts.onProgress?.(line.message);
      else if (line.type === 'layer') {
        reply.body.resume();
        return line.layer;
      } else if (line.type === 'error') throw streamedError(line.error);
    }
    throw new DsecError('UNAVAILABLE', `${what}: the stream ended without a layer`);
  }

  /**
   * Downloads a `disk` layer's image (raw by default, or qcow2) to `file`; runs of zeros are
   * skipped, so a raw image stays sparse. Returns the image's size in bytes.
   */
  async exportDisk(ref: string, file: string, opts: CallOptions & { format?: 'raw' | 'qcow2' } = {}): Promise<number> {
    const layer = validate(LayerRefSchema, ref, 'ref');
    const reply = await this.client.stream(
      { method: 'GET', path: `/v1/disk-images/${encodeURIComponent(layer)}`, query: { format: opts.format ?? 'raw' }, timeoutMs: opts.requestTimeoutMs ?? 0 },
      opts,
    );
    const fh = await open(file, 'w', 0o644);
    let size = 0;
    try {
      for await (const chunk of reply.body as AsyncIterable<Buffer>) {
        // Write what is not all zeros; holes make the rest.
        for (let at = 0; at < chunk.length; at += SPARSE_BLOCK_BYTES) {
          const block = chunk.subarray(at, at + SPARSE_BLOCK_BYTES);
          if (!isZero(block)) await fh.write(block, 0, block.length, size + at);
        }
        size += chunk.length;
      }
      await fh.truncate(size);
    } finally {
      await fh.close();
    }
    return size;
  }

  /** Lists the project's layers and the public ones, optionally of one kind. */
  async list(opts: CallOptions & { kind?: LayerInfo['kind'] } = {}): Promise<LayerInfo[]> {
    const kind = opts.kind === undefined ? undefined : validate(LayerKindSchema, opts.kind, 'kind');
    return (await this.client.json<{ items: LayerInfo[] }>({ method: 'GET', path: '/v1/layers', query: { kind } }, opts)).items;
  }

  /** One layer by reference (`name:tag`, `sha256:<hex>`). */
  async get(ref: string, opts: CallOptions = {}): Promise<LayerInfo> {
    const r = validate(LayerRefSchema, ref, 'ref');
    return this.client.json({ method: 'GET', path: `/v1/layers/${encodeURIComponent(r)}` }, opts);
  }

  /** Removes a layer (CONFLICT while a sandbox uses it). */
  async remove(ref: string, opts: CallOptions = {}): Promise<void> {
    const r = validate(LayerRefSchema, ref, 'ref');
    await this.client.request({ method: 'DELETE', path: `/v1/layers/${encodeURIComponent(r)}` }, opts);
  }
}

function* chunksOf(buf: Buffer, size: number): Generator<Buffer> {
  for (let i = 0; i < buf.length; i += size) yield buf.subarray(i, i + size);
}

/** An `{type:"error"}` event of a stream as a DsecError. */
export function streamedError(e: { code: string; message: string } & Record<string, unknown>): DsecError {
  const { code, message, ...details } = e;
  return new DsecError(code in ERROR_STATUS ? (code as ErrorCode) : 'INTERNAL', message, details);
}

/** Block size of the zero test of {@link LayersApi.exportDisk}. */
const SPARSE_BLOCK_BYTES = 64 * 1024;

const ZEROS = Buffer.alloc(SPARSE_BLOCK_BYTES);

function isZero(b: Buffer): boolean {
  return b.equals(ZEROS.subarray(0, b.length));
}
