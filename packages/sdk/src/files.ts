// sandbox.files: read, write, list and move files inside a sandbox; directories as tar.
import { Transform } from 'node:stream';
import type { Readable } from 'node:stream';
import { FilePathQuerySchema, RenameRequestSchema, isDsecError } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';
import { packDir, unpackInto } from './tar.js';
import type { FileInfo } from './types.js';
import { validate } from './validate.js';

/** Options of files.read. */
export interface FileReadOptions extends CallOptions {
  /** `text` (UTF-8 string, default) or `bytes` (Buffer). */
  format?: 'text' | 'bytes';
  /** First byte to read. */
  offset?: number;
  /** Most bytes to read. */
  length?: number;
}

/** Options of files.write. */
export interface FileWriteOptions extends CallOptions {
  /** Permission bits of a new file, e.g. `0o755`; default the server's (0644). */
  mode?: number;
  /** Append instead of replacing. */
  append?: boolean;
}

/** Result of a directory transfer. */
export interface DirTransferResult {
  /** Bytes of tar sent or received. */
  tarBytes: number;
}

/** Files of one sandbox. Paths are absolute paths inside the sandbox. */
export class Files {
  constructor(
    private readonly client: DsecClient,
    private readonly sandboxId: string,
  ) {}

  #route(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/files${suffix}`;
  }

  #path(path: string, field = 'path'): string {
    return validate(FilePathQuerySchema.shape.path, path, field);
  }

  /** Reads a file as text (default) or bytes. */
  async read(path: string, opts?: FileReadOptions & { format?: 'text' }): Promise<string>;
  async read(path: string, opts: FileReadOptions & { format: 'bytes' }): Promise<Buffer>;
  async read(path: string, opts: FileReadOptions = {}): Promise<string | Buffer> {
    const q = validate(FilePathQuerySchema, { path, offset: opts.offset, length: opts.length });
    const reply = await this.client.request(
      { method: 'GET', path: this.#route(), query: { path: q.path, offset: q.offset, length: q.length }, accept: 'application/octet-stream' },
      opts,
    );
    return opts.format === 'bytes' ? reply.body : reply.body.toString('utf8');
  }

  /** Writes a file (creating parent directories as the server does), replacing or appending. */
  async write(path: string, data: string | Uint8Array | Readable, opts: FileWriteOptions = {}): Promise<void> {
    const mode = opts.mode === undefined ? undefined : opts.mode.toString(8).padStart(4, '0');
    const q = validate(FilePathQuerySchema, { path, mode, append: opts.append === undefined ? undefined : String(opts.append) });
    const body = typeof data === 'string' ? Buffer.from(data) : data;
    await this.client.request(
      { method: 'PUT', path: this.#route(), query: { path: q.path, mode: q.mode, append: q.append }, body, contentType: 'application/octet-stream' },
      opts,
    );
  }

  /** Lists a directory. */
  async list(path: string, opts: CallOptions = {}): Promise<FileInfo[]> {
    const reply = await this.client.json<{ items: FileInfo[] }>({ method: 'GET', path: this.#route('/list'), query: { path: this.#path(path) } }, opts);
    return reply.items;
  }

  /** Metadata of one file (FILE_NOT_FOUND when missing). */
  async stat(path: string, opts: CallOptions = {}): Promise<FileInfo> {
    return this.client.json<FileInfo>({ method: 'GET', path: this.#route('/stat'), query: { path: this.#path(path) } }, opts);
  }

  /** True when the path exists. */
  async exists(path: string, opts: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, opts);
      return true;
    } catch (err) {
      if (isDsecError(err, 'FILE_NOT_FOUND') || isDsecError(err, 'NOT_FOUND')) return false;
      throw err;
    }
  }

  /** Removes a file, or a directory with `recursive`. */
  async remove(path: string, opts: CallOptions & { recursive?: boolean } = {}): Promise<void> {
    const query = { path: this.#path(path), recursive: opts.recursive ? 'true' : undefined };
    await this.client.request({ method: 'DELETE', path: this.#route(), query }, opts);
  }

  /** Creates a directory and its parents (`mkdir -p`). */
  async makeDir(path: string, opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'POST', path: this.#route('/mkdir'), query: { path: this.#path(path) } }, opts);
  }

  /** Renames (moves) a file or directory. */
  async rename(from: string, to: string, opts: CallOptions = {}): Promise<void> {
    const body = validate(RenameRequestSchema, { from, to });
    await this.client.request({ method: 'POST', path: this.#route('/rename'), body }, opts);
  }

  /** Uploads the content of a local directory into `remoteDir` (created if missing) as one tar. */
  async uploadDir(localDir: string, remoteDir: string, opts: CallOptions = {}): Promise<DirTransferResult> {
    const remote = this.#path(remoteDir, 'remoteDir');
    let tarBytes = 0;
    await this.client.request(
      {
        method: 'PUT',
        path: this.#route('/tar'),
        query: { path: remote },
        body: packDir(localDir),
        contentType: 'application/x-tar',
        onUploadProgress: (n) => (tarBytes = n),
        timeoutMs: opts.requestTimeoutMs ?? 0,
      },
      opts,
    );
    return { tarBytes };
  }

  /** Downloads `remoteDir` as a tar and unpacks it into `localDir` (created if missing). */
  async downloadDir(remoteDir: string, localDir: string, opts: CallOptions = {}): Promise<DirTransferResult> {
    const remote = this.#path(remoteDir, 'remoteDir');
    const reply = await this.client.stream({ method: 'GET', path: this.#route('/tar'), query: { path: remote }, accept: 'application/x-tar' }, opts);
    let tarBytes = 0;
    // Count through a pipe, not a 'data' listener: a listener would start the flow before the
    // unpacker is attached, and the first chunks would be lost.
    const counted = reply.body.pipe(
      new Transform({
        transform(chunk: Buffer, _enc, done) {
          tarBytes += chunk.length;
          done(null, chunk);
        },
      }),
    );
    reply.body.on('error', (err) => counted.destroy(err));
    await unpackInto(counted, localDir);
    return { tarBytes };
  }

  /** Reads a whole file as a stream of bytes (for large files). */
  async readStream(path: string, opts: CallOptions = {}): Promise<Readable> {
    const reply = await this.client.stream({ method: 'GET', path: this.#route(), query: { path: this.#path(path) }, accept: 'application/octet-stream' }, opts);
    return reply.body;
  }
}
