// The node's layer store: builds content-addressed EROFS layers, names them, and mounts each
// one once per node (refcounted) for every sandbox's overlay to use as a lower dir.
import { randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { access, copyFile, link, mkdir, mkdtemp, open, readdir, readFile, rename, rm, rmdir, stat, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { DsecError, normalizeLayerName } from '@dsec/protocol';
import type { LayerInfo, LayerKind, ReadDiskOptions } from '@dsec/protocol';
import { mount, mountsUnder, MNT, MS, SyscallError, umount } from '../sys/linux.js';
import { buildBusyboxTree } from './busybox.js';
import { buildDebianTree, DEFAULT_DEBIAN_SUITE } from './debian.js';
import { withShiftedView } from '../host/idmap.js';
import { readPool } from '../host/read-pool.js';
import type { IdShift } from '../host/idmap.js';
import { DEFAULT_CHUNK_SIZE_BYTES, layerDigest, mkfsErofs, snapshotUuid } from './erofs.js';
import { digestHex } from './names.js';
import { pullImage } from './image-pull.js';
import { importOci } from './oci.js';
import type { RegistryEndpoint } from './registry.js';
import type { LayerRegistry } from './remote.js';
import { TarExtractor } from './tar-extract.js';
import { CHUNK_INDEX_FILE, DEFAULT_LAZY_SERVER_IDLE_MS, LAZY_RECORD_FILE, LazyLayers } from './lazy.js';
import type { LazyCacheStats, LazyOptions, LazyRecord } from './lazy.js';
import { encodeChunkIndex } from './lazy-index.js';
import { buildThroughCache } from './machine-cache.js';
import { buildVmImage, exportRawImage, importDiskImage } from './vm-image.js';
import type { TarInput, TarLimits } from './tar-extract.js';

/** How long an unused layer stays mounted after its last release. */
export const DEFAULT_UNMOUNT_LINGER_MS = 10_000;
/** How long a layer just used is safe from eviction. */
const DEFAULT_EVICT_GRACE_MS = 60_000;

/** Options of {@link LayerStore}. */
export interface LayerStoreOptions {
  /** Directory the store owns, e.g. `$DSEC_HOME/layers`. */
  root: string;
  /** The machine-wide cache of built layers that builds asking for it go through (machine-cache.ts); none: they build here. */
  machineCacheDir?: string | undefined;
  /** Chunk size of data blobs in bytes (power of two >= 4096); default 1 MiB. */
  chunkSizeBytes?: number;
  /** Limits applied to tar and OCI sources; defaults in {@link DEFAULT_TAR_LIMITS}. */
  tarLimits?: Partial<TarLimits>;
  /** Milliseconds an unreferenced layer stays mounted; default 10 s, 0 unmounts at once. */
  unmountLingerMs?: number;
  /**
   * The registry the node keeps its layers in: every layer is pushed there before it is
   * committed, and a layer asked for by digest that the node lacks is pulled from there.
   */
  registry?: LayerRegistry | undefined;
  /**
   * Bytes of layers kept on the node when a registry holds them all: past it, the layers no
   * sandbox uses and no name points at are removed, least recently used first. Default none.
   */
  cacheMaxBytes?: number | undefined;
  /**
   * A layer used (built, pulled or mounted) this recently is never evicted, so that a pulled
   * layer is still there when the create that pulled it mounts it. Default 60 s.
   */
  evictGraceMs?: number | undefined;
  /** Registries `image` sources may name (the operator's `node.pullFrom`); default none. */
  pullFrom?: readonly RegistryEndpoint[] | undefined;
  /**
   * Lazy loading (with a registry): a layer the node lacks is pulled without its data blob and
   * mounted over a FUSE view of it that fetches the chunks read (lazy.ts). Default off.
   */
  lazy?: LazyOptions | undefined;
  /** How VM disk images are built (`vm` sources): chronus to install, the machine-wide cache. */
  vmImage?: { agentBinary: string; cacheDir?: string | undefined } | undefined;
}

/** Where a layer's files come from. */
export type LayerSource =
  | { type: 'dir'; path: string }
  | { type: 'tar'; stream: TarInput }
  | { type: 'oci'; path: string }
  /** An OCI image archive as a byte stream (an upload): spooled to a file, then imported as `oci`. */
  | { type: 'oci-archive'; stream: AsyncIterable<Uint8Array> }
  | { type: 'debian'; suite?: string; packages: string[]; variant?: 'minbase' | 'apt' }
  | { type: 'busybox' }
  /** An OCI or Docker image in one of the registries of {@link LayerStoreOptions.pullFrom}, squashed. */
  | { type: 'image'; ref: string }
  /** A bootable VM disk (`disk` kind): Debian with systemd, the guest agent and chronus (vm-image.ts). */
  | { type: 'vm'; suite?: string; packages?: string[]; desktop?: boolean }
  /** An uploaded qcow2 or raw disk image (`disk` kind), validated and stored as qcow2. */
  | { type: 'disk'; stream: AsyncIterable<Uint8Array> }
  /**
   * A VM's disk as the node flattened it (`disk` kind; a `vm` snapshot): `write` makes a
   * standalone qcow2 (no backing file) at the path it is given, which becomes the blob as it is.
   */
  | { type: 'vm-disk'; write: (out: string, signal?: AbortSignal) => Promise<void> }
  /**
   * A sandbox's overlay upper directory ("pack diff"), packed as it is: whiteouts (char 0:0)
   * and opaque directories stay, so the layer stacks over `parents` (its digests, bottom first,
   * recorded in the layer's UUID and so in its digest). The caller keeps the tree still
   * (freezes the sandbox). `idShift` stores host ids `base + n` as `n` (user-namespaced
   * sandboxes).
   */
  | { type: 'upper'; dir: string; parents: string[]; idShift?: IdShift };

/** Options of {@link LayerStore.build}. */
export interface BuildLayerOptions {
  kind: LayerKind;
  /** `name` or `name:tag` (tag defaults to `latest`) to point at the layer. */
  name?: string;
  /** Merged into the layer's labels (also when the layer already existed). */
  labels?: Record<string, string>;
  onProgress?: (msg: string) => void;
  /**
   * Called once the source tree has been read (mkfs is done), before the digest is computed
   * and the layer committed: a snapshot thaws its sandbox here.
   */
  onSourceRead?: () => Promise<void>;
  signal?: AbortSignal;
  /** Build into (or take from) the machine-wide cache, keyed by `name` (which must then be given); see {@link LayerStoreOptions.machineCacheDir}. */
  machineCache?: boolean;
}

/** Result of {@link LayerStore.gc}. */
export interface LayerGcResult {
  /** Digests of the deleted layers. */
  removed: string[];
}

type StoredLayer = Omit<LayerInfo, 'names'>;

/** Largest slice {@link LayerStore.readDisk} returns. */
const MAX_DISK_READ_BYTES = 8 * 1024 * 1024;
/** How long a raw export stays after its last read. */
const RAW_EXPORT_LINGER_MS = 60_000;

/** Label of a `disk` layer whose guest runs chronus (else the QEMU guest agent alone serves it). */
export const VM_AGENT_LABEL = 'dsec.vm.agent';
/** Label of a disk layer naming the bus its root disk needs: `virtio-blk` or (default) `nvme`. */
export const VM_DISK_LABEL = 'dsec.vm.disk';
/** Label of a desktop disk image (`dsec image build --vm --desktop`): its display server. */
export const VM_DESKTOP_LABEL = 'dsec.vm.desktop';

const META_FILE = 'meta.erofs';
const BLOB_FILE = 'data.blob';
const INFO_FILE = 'layer.json';
const NAMES_FILE = 'names.json';
/** Present in a layer's directory once the registry holds the layer (so it may be evicted). */
const IN_REGISTRY_FILE = 'in-registry';
const EBUSY = 16;

/** Content-addressed EROFS layers on one node: build, name, mount, collect. */
export class LayerStore {
  private readonly root: string;
  private readonly blobsDir: string;
  private readonly mntDir: string;
  private readonly tmpDir: string;
  private readonly chunkSizeBytes: number;
  private readonly lingerMs: number;
  private readonly layers = new Map<string, StoredLayer>();
  /** `name:tag` -> hex digest. */
  private readonly names = new Map<string, string>();
  private readonly refs = new Map<string, number>();
  private readonly mounted = new Set<string>();
  private readonly lingering = new Map<string, NodeJS.Timeout>();
  /** Layers the registry holds; hex -> last use (ms since the epoch), for eviction. */
  private readonly evictable = new Map<string, number>();
  /** Pulls in progress, so that many creates needing one layer pull it once. */
  private readonly pulls = new Map<string, Promise<LayerInfo>>();
  private initialized: Promise<void> | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  /** Lazily loaded layers' servers and the chunk cache (with `lazy` and a registry). */
  readonly lazy: LazyLayers | undefined;
  /** Layers held without their data blob (hex). */
  private readonly lazyLayers = new Set<string>();
  /** Raw conversions of disk layers being exported (hex -> the raw file). */
  private readonly rawExports = new Map<string, Promise<string>>();
  private readonly rawExpiry = new Map<string, NodeJS.Timeout>();
  /** Lazy servers being stopped, so that an acquire waits for the stop before starting one. */
  private readonly lazyStops = new Map<string, Promise<void>>();
  /** Layers whose lazy server died while mounted (see {@link dropDeadMount}). */
  private readonly lostLayers = new Set<string>();
  /** Lazy servers kept after their layer's unmount, until these timers stop them (see {@link idleLazy}). */
  private readonly lazyIdle = new Map<string, NodeJS.Timeout>();

  constructor(private readonly opts: LayerStoreOptions) {
    this.root = opts.root;
    this.blobsDir = join(opts.root, 'blobs');
    this.mntDir = join(opts.root, 'mnt');
    this.tmpDir = join(opts.root, 'tmp');
    this.chunkSizeBytes = opts.chunkSizeBytes ?? DEFAULT_CHUNK_SIZE_BYTES;
    this.lingerMs = opts.unmountLingerMs ?? DEFAULT_UNMOUNT_LINGER_MS;
    this.lazy = opts.lazy && opts.registry ? new LazyLayers(opts.root, opts.registry, opts.lazy) : undefined;
    if (this.lazy !== undefined) {
      this.lazy.onServerLost = (hex) => {
        this.locked(() => this.dropDeadMount(hex)).catch(() => undefined);
      };
    }
  }

  /** Creates the directories, loads the index, removes half-built layers, adopts mounts. */
  init(): Promise<void> {
    this.initialized ??= this.load().catch((err: unknown) => {
      this.initialized = undefined;
      throw err;
    });
    return this.initialized;
  }

  private async load(): Promise<void> {
    for (const dir of [this.root, this.blobsDir, this.mntDir, this.tmpDir]) await mkdir(dir, { recursive: true });
    for (const name of await readdir(this.tmpDir)) await safeRemove(join(this.tmpDir, name));
    for (const hex of await readdir(this.blobsDir)) {
      const dir = join(this.blobsDir, hex);
      const info = await readFile(join(dir, INFO_FILE), 'utf8')
        .then((t) => JSON.parse(t) as LayerInfo)
        .catch(() => null);
      if (digestHex(hex) !== hex || info === null || info.digest !== `sha256:${hex}`) {
        // Not something this store committed (commits rename a complete directory into place).
        await safeRemove(dir);
        continue;
      }
      const { names: _names, ...stored } = info;
      this.layers.set(hex, stored);
      if (await exists(join(dir, LAZY_RECORD_FILE))) this.lazyLayers.add(hex);
      const marker = await stat(join(dir, IN_REGISTRY_FILE)).catch(() => null);
      if (marker !== null) this.evictable.set(hex, marker.mtimeMs);
    }
    const names = await readFile(join(this.root, NAMES_FILE), 'utf8')
      .then((t) => JSON.parse(t) as Record<string, string>)
      .catch(() => ({}));
    for (const [name, digest] of Object.entries(names)) {
      const hex = digestHex(digest);
      if (hex !== null && this.layers.has(hex)) this.names.set(name, hex);
    }
    for (const target of await mountsUnder(this.mntDir)) {
      const hex = target.slice(this.mntDir.length + 1);
      if (this.layers.has(hex)) this.mounted.add(hex);
    }
    // Lazy servers an earlier edge left: those of mounted layers serve on (their events are
    // followed again), the others stop.
    if (this.lazy !== undefined) {
      for (const hex of await this.lazy.serverDirs()) {
        if (this.mounted.has(hex) && this.lazyLayers.has(hex) && !(await this.lazy.gone(hex))) await this.lazy.start(hex, join(this.blobsDir, hex));
        else if (this.mounted.has(hex) && this.lazyLayers.has(hex)) await this.dropDeadMount(hex);
        else if (this.lazyLayers.has(hex) && (await this.lazy.running(hex))) {
          // An idle server: followed (its chunks pinned, its connection held) until its time is up.
          await this.lazy.start(hex, join(this.blobsDir, hex));
          this.idleLazy(hex);
        } else await this.lazy.stop(hex);
      }
    }
  }

  /** Builds a layer from `source`; an existing identical layer only gains the name and labels. */
  async build(source: LayerSource, opts: BuildLayerOptions): Promise<LayerInfo> {
    await this.init();
    const { signal } = opts;
    const progress = opts.onProgress ?? (() => undefined);
    const name = opts.name === undefined ? undefined : normalizeLayerName(opts.name);
    signal?.throwIfAborted();
    const cacheDir = this.opts.machineCacheDir;
    if (opts.machineCache && cacheDir !== undefined && opts.name !== undefined) {
      const { machineCache: _cached, ...rest } = opts;
      return buildThroughCache(this, cacheDir, opts.name, (scratch) => scratch.build(source, rest));
    }
    const work = await mkdtemp(join(this.tmpDir, 'build-'));
    try {
      if (source.type === 'vm' || source.type === 'disk' || source.type === 'vm-disk') return await this.buildDisk(source, work, opts, name);
      let tree = join(work, 'root');
      let uuid: string | undefined;
      let shift: IdShift | undefined;
      const limits = this.opts.tarLimits;
      switch (source.type) {
        case 'upper': {
          const st = await stat(source.dir).catch(() => null);
          if (!st?.isDirectory())
            throw new DsecError('INVALID_ARGUMENT', `source.dir: not a directory: ${source.dir}`, { field: 'source.dir', path: source.dir });
          tree = source.dir;
          uuid = snapshotUuid(source.parents);
          shift = source.idShift;
          break;
        }
        case 'dir': {
          const st = await stat(source.path).catch(() => null);
          if (!st?.isDirectory())
            throw new DsecError('INVALID_ARGUMENT', `source.path: not a directory: ${source.path}`, { field: 'source.path', path: source.path });
          tree = source.path;
          break;
        }
        case 'tar': {
          await mkdir(tree);
          progress('extracting tar');
          const extractor = new TarExtractor(tree, { whiteouts: 'record', limits, signal, onProgress: progress });
          await extractor.extract(source.stream);
          const { entries } = await extractor.finish();
          progress(`extracted ${entries} entries`);
          break;
        }
        case 'oci':
          await mkdir(tree);
          await importOci(source.path, tree, { workDir: work, limits, signal, onProgress: progress });
          break;
        case 'oci-archive': {
          // The importer reads the archive's index first and blobs out of order: it needs a file.
          const archive = join(work, 'upload.oci.tar');
          await pipeline(Readable.from(source.stream), createWriteStream(archive), ...(signal ? [{ signal }] : []));
          await mkdir(tree);
          await importOci(archive, tree, { workDir: work, limits, signal, onProgress: progress });
          break;
        }
        case 'debian':
          await buildDebianTree(tree, {
            suite: source.suite ?? DEFAULT_DEBIAN_SUITE,
            packages: source.packages,
            variant: source.variant ?? 'minbase',
            signal,
            onProgress: progress,
          });
          // mmdebstrap unmounts what it mounted; make sure before the tree is read.
          for (const m of await mountsUnder(tree)) umount(m, MNT.DETACH);
          break;
        case 'busybox':
          await mkdir(tree);
          await buildBusyboxTree(tree);
          break;
        case 'image': {
          const layout = join(work, 'image');
          progress(`pulling ${source.ref}`);
          await pullImage(source.ref, layout, { registries: this.opts.pullFrom ?? [], signal, onProgress: progress });
          await mkdir(tree);
          await importOci(layout, tree, { workDir: work, limits, signal, onProgress: progress });
          break;
        }
        default:
          throw new DsecError('INVALID_ARGUMENT', `source.type: unknown layer source ${(source as { type: string }).type}`, { field: 'source.type' });
      }
      signal?.throwIfAborted();
      const out = join(work, 'out');
      await mkdir(out);
      const pack = async (dir: string): Promise<{ files: number; contentBytes: number }> => {
        const counted = await countTree(dir, signal);
        progress(`mkfs.erofs: ${counted.files} files, ${counted.contentBytes} bytes`);
        await mkfsErofs(dir, join(out, META_FILE), join(out, BLOB_FILE), { chunkSizeBytes: this.chunkSizeBytes, uuid, signal });
        return counted;
      };
      const { files, contentBytes } =
        shift === undefined ? await pack(tree) : await withShiftedView(tree, join(work, 'shifted'), shift, () => pack(join(work, 'shifted')));
      await opts.onSourceRead?.();
      return await this.finishBuild(out, { kind: opts.kind, labels: { ...opts.labels }, contentBytes, files }, opts, name);
    } finally {
      await safeRemove(work);
    }
  }

  /** Digest, push (with a registry) and commit of a layer built into `out` (meta + blob). */
  private async finishBuild(
    out: string,
    fields: Pick<StoredLayer, 'kind' | 'labels' | 'contentBytes' | 'files'>,
    opts: BuildLayerOptions,
    name: string | undefined,
  ): Promise<LayerInfo> {
    const { signal } = opts;
    const progress = opts.onProgress ?? (() => undefined);
    const digest = await layerDigest(join(out, META_FILE), join(out, BLOB_FILE));
    signal?.throwIfAborted();
    const [meta, blob] = await Promise.all([stat(join(out, META_FILE)), stat(join(out, BLOB_FILE))]);
    const layer: StoredLayer = { digest, ...fields, metaBytes: meta.size, blobBytes: blob.size, createdAt: new Date().toISOString() };
    const registry = this.opts.registry;
    if (registry !== undefined && !this.evictable.has(digest.slice('sha256:'.length))) {
      progress(`pushing ${digest} to ${registry.client.url}`);
      await registry.push({ meta: join(out, META_FILE), blob: join(out, BLOB_FILE) }, layer, signal);
      await writeFile(join(out, IN_REGISTRY_FILE), '');
    }
    const info = await this.locked(() => this.commit(out, layer, opts.labels, name));
    await this.evict();
    progress(`layer ${digest}`);
    return info;
  }

  /**
   * A `disk` layer: a qcow2 image as the layer's blob (its meta empty, so the digest is the
   * image's sha256), built from Debian (`vm`) or an upload (`disk`, validated).
   */
  private async buildDisk(
    source: Extract<LayerSource, { type: 'vm' | 'disk' | 'vm-disk' }>,
    work: string,
    opts: BuildLayerOptions,
    name: string | undefined,
  ): Promise<LayerInfo> {
    const { signal } = opts;
    const out = join(work, 'out');
    await mkdir(out);
    const qcow = join(out, BLOB_FILE);
    const labels: Record<string, string> = { ...opts.labels };
    if (source.type === 'vm') {
      if (!this.opts.vmImage) throw new DsecError('UNAVAILABLE', 'this node builds no VM images');
      const image = await buildVmImage({
        ...this.opts.vmImage,
        ...(source.suite ? { suite: source.suite } : {}),
        ...(source.packages ? { packages: source.packages } : {}),
        ...(source.desktop ? { desktop: true } : {}),
        signal,
        onProgress: opts.onProgress,
      });
      await link(image, qcow).catch(() => copyFile(image, qcow));
      labels[VM_AGENT_LABEL] = 'chronus';
      // The root's bus: a desktop image's kernel has an initramfs with virtio-blk (migratable).
      labels[VM_DISK_LABEL] = source.desktop ? 'virtio-blk' : 'nvme';
      if (source.desktop) labels[VM_DESKTOP_LABEL] = 'x11';
    } else if (source.type === 'vm-disk') {
      // The caller's labels say what the image boots with (its parent's agent, bus and desktop).
      await source.write(qcow, signal);
    } else {
      const upload = join(work, 'upload.img');
      await pipeline(Readable.from(source.stream), createWriteStream(upload), ...(signal ? [{ signal }] : []));
      opts.onProgress?.('validating the disk image');
      await importDiskImage(upload, qcow, signal);
      await rm(upload, { force: true });
    }
    await writeFile(join(out, META_FILE), '');
    // The bytes the node stores (a tenant's layer storage counts them), not the virtual size.
    const contentBytes = (await stat(qcow)).size;
    return this.finishBuild(out, { kind: 'disk', labels, contentBytes, files: 0 }, { ...opts, labels }, name);
  }

  /** The qcow2 image of a `disk` layer (QEMU opens it read-only, as an overlay's backing). */
  diskFile(digest: string): string {
    const hex = this.hexOf(digest);
    if (this.layers.get(hex)?.kind !== 'disk') throw new DsecError('INVALID_ARGUMENT', `layer ${digest} is not a disk image`, { field: 'image.base' });
    return join(this.blobsDir, hex, BLOB_FILE);
  }

  /**
   * Bytes of a `disk` layer's image from `offset` (empty past the end): its qcow2 as stored, or
   * as raw, converted once into the store's tmp directory (sparse) and kept while it is read.
   */
  async readDisk(ref: string, opts: ReadDiskOptions): Promise<Uint8Array> {
    await this.init();
    const info = await this.resolve(ref);
    const hex = this.hexOf(info.digest);
    let file = this.diskFile(info.digest);
    if (opts.format === 'raw') {
      let pending = this.rawExports.get(hex);
      if (!pending) {
        const out = join(this.tmpDir, `export-${hex}.raw`);
        pending = exportRawImage(file, `${out}.part`)
          .then(() => rename(`${out}.part`, out))
          .then(() => out);
        pending.catch(() => this.rawExports.delete(hex));
        this.rawExports.set(hex, pending);
      }
      file = await pending;
      // Removed a while after its last read (an export reads it front to back).
      clearTimeout(this.rawExpiry.get(hex));
      this.rawExpiry.set(
        hex,
        setTimeout(() => {
          this.rawExports.delete(hex);
          this.rawExpiry.delete(hex);
          void rm(file, { force: true });
        }, RAW_EXPORT_LINGER_MS).unref(),
      );
    }
    const fh = await open(file, 'r');
    try {
      const buf = Buffer.alloc(Math.min(opts.length, MAX_DISK_READ_BYTES));
      const { bytesRead } = await fh.read(buf, 0, buf.length, opts.offset);
      return buf.subarray(0, bytesRead);
    } finally {
      await fh.close();
    }
  }

  private async commit(out: string, layer: StoredLayer, labels: Record<string, string> | undefined, name: string | undefined): Promise<LayerInfo> {
    const hex = layer.digest.slice('sha256:'.length);
    const existing = this.layers.get(hex);
    if (existing !== undefined) {
      if (labels !== undefined && Object.keys(labels).length > 0) {
        existing.labels = { ...existing.labels, ...labels };
        await this.writeInfo(hex);
      }
    } else {
      await writeFile(join(out, INFO_FILE), JSON.stringify({ ...layer, names: [] }, null, 2));
      await rename(out, join(this.blobsDir, hex));
      this.layers.set(hex, layer);
      if (await exists(join(this.blobsDir, hex, IN_REGISTRY_FILE))) this.evictable.set(hex, Date.now());
    }
    if (name !== undefined) {
      this.names.set(name, hex);
      await this.saveNames();
    }
    return this.info(hex);
  }

  /**
   * Takes in a layer another store committed (`dir` holds its meta, blob and info, as this
   * store's `blobs/<hex>` does: a machine-wide cache of built layers), hard-linked when `dir` is
   * on the same file system, else copied; sizes are checked against its info. Named `name`.
   */
  async adopt(dir: string, name: string): Promise<LayerInfo> {
    await this.init();
    const info = JSON.parse(await readFile(join(dir, INFO_FILE), 'utf8')) as LayerInfo;
    const hex = digestHex(info.digest);
    if (hex === null) throw new DsecError('INVALID_ARGUMENT', `${dir}: not a layer (bad digest)`);
    if (this.layers.has(hex)) return this.locked(() => this.commit(join(this.blobsDir, hex), this.layers.get(hex)!, undefined, normalizeLayerName(name)));
    const work = await mkdtemp(join(this.tmpDir, 'adopt-'));
    try {
      const out = join(work, 'out');
      await mkdir(out);
      for (const f of [META_FILE, BLOB_FILE]) {
        await link(join(dir, f), join(out, f)).catch(() => copyFile(join(dir, f), join(out, f)));
      }
      const [meta, blob] = await Promise.all([stat(join(out, META_FILE)), stat(join(out, BLOB_FILE))]);
      if (meta.size !== info.metaBytes || blob.size !== info.blobBytes) throw new DsecError('INTERNAL', `${dir}: layer files do not match their info`);
      const { names: _names, ...layer } = info;
      return await this.locked(() => this.commit(out, layer, undefined, normalizeLayerName(name)));
    } finally {
      await safeRemove(work);
    }
  }

  /** Looks up `sha256:<hex>`, bare hex, `name` or `name:tag`; LAYER_NOT_FOUND when unknown. */
  async resolve(ref: string): Promise<LayerInfo> {
    await this.init();
    return this.info(this.hexOf(ref));
  }

  /**
   * Like {@link resolve}, but a digest the node does not hold is pulled from the registry (once,
   * however many callers ask at the same time). A create calls this; listings call resolve.
   */
  async fetch(ref: string, signal?: AbortSignal): Promise<LayerInfo> {
    await this.init();
    const hex = digestHex(ref);
    const registry = this.opts.registry;
    if (hex === null || registry === undefined || this.layers.has(hex)) return this.resolve(ref);
    let pull = this.pulls.get(hex);
    if (pull === undefined) {
      pull = this.pull(registry, hex, signal).finally(() => this.pulls.delete(hex));
      this.pulls.set(hex, pull);
    }
    return pull;
  }

  private async pull(registry: LayerRegistry, hex: string, signal?: AbortSignal): Promise<LayerInfo> {
    const work = await mkdtemp(join(this.tmpDir, 'pull-'));
    try {
      const out = join(work, 'out');
      await mkdir(out);
      if (this.lazy !== undefined) {
        const lazy = await registry.pullLazy(`sha256:${hex}`, join(out, META_FILE), signal);
        if (lazy !== undefined) {
          await writeFile(join(out, CHUNK_INDEX_FILE), encodeChunkIndex(lazy.index));
          const record: LazyRecord = { blobDigest: lazy.blobDigest };
          await writeFile(join(out, LAZY_RECORD_FILE), JSON.stringify(record));
          await writeFile(join(out, IN_REGISTRY_FILE), '');
          const meta = await stat(join(out, META_FILE));
          const layer: StoredLayer = { ...lazy.record, labels: { ...lazy.record.labels }, metaBytes: meta.size, blobBytes: lazy.index.blobBytes };
          const info = await this.locked(async () => {
            const committed = await this.commit(out, layer, undefined, undefined);
            if (await exists(join(this.blobsDir, hex, LAZY_RECORD_FILE))) this.lazyLayers.add(hex);
            return committed;
          });
          await this.evict();
          return info;
        }
      }
      const files = { meta: join(out, META_FILE), blob: join(out, BLOB_FILE) };
      const record = await registry.pull(`sha256:${hex}`, files, signal);
      const [meta, blob] = await Promise.all([stat(files.meta), stat(files.blob)]);
      await writeFile(join(out, IN_REGISTRY_FILE), '');
      const layer: StoredLayer = { ...record, labels: { ...record.labels }, metaBytes: meta.size, blobBytes: blob.size };
      const info = await this.locked(() => this.commit(out, layer, undefined, undefined));
      await this.evict();
      return info;
    } finally {
      await safeRemove(work);
    }
  }

  /**
   * Removes layers the registry holds, that no sandbox uses and no name points at, least
   * recently used first, until the node's layers fit {@link LayerStoreOptions.cacheMaxBytes}.
   */
  private async evict(): Promise<void> {
    const max = this.opts.cacheMaxBytes;
    if (max === undefined) return;
    await this.locked(async () => {
      let total = 0;
      for (const [h, l] of this.layers) total += this.diskBytes(h, l);
      const named = new Set(this.names.values());
      const recent = Date.now() - (this.opts.evictGraceMs ?? DEFAULT_EVICT_GRACE_MS);
      const candidates = [...this.evictable].sort((a, b) => a[1] - b[1]);
      for (const [hex, lastUse] of candidates) {
        if (total <= max || lastUse > recent) break;
        const layer = this.layers.get(hex);
        if (layer === undefined || named.has(hex) || (this.refs.get(hex) ?? 0) > 0 || this.pulls.has(hex)) continue;
        if (!this.tryUnmount(hex)) continue;
        const bytes = this.diskBytes(hex, layer);
        await this.deleteLayer(hex);
        total -= bytes;
      }
    });
  }

  /** Bytes a layer takes on the node (a lazy layer's chunks are in the chunk cache). */
  private diskBytes(hex: string, layer: StoredLayer): number {
    return layer.metaBytes + (this.lazyLayers.has(hex) ? 0 : layer.blobBytes);
  }

  /** Whether the node holds the layer without its data blob (chunks fetched as read). */
  isLazy(digest: string): boolean {
    const hex = digestHex(digest);
    return hex !== null && this.lazyLayers.has(hex);
  }

  /** The chunk cache and fetch counters; undefined without lazy loading. */
  async lazyStats(): Promise<LazyCacheStats | undefined> {
    return this.lazy?.stats();
  }

  /** {@link lazyStats} as the edge interface has it (null without lazy loading). */
  async cacheStats(): Promise<LazyCacheStats | null> {
    return (await this.lazy?.stats()) ?? null;
  }

  /**
   * The first command of a sandbox using these layers ended: the lazy ones this node is
   * recording an access profile for store it in the registry (see LazyLayers.recordProfile).
   * Resolves to the digests whose profile was stored.
   */
  async recordProfiles(digests: string[]): Promise<string[]> {
    const stored: string[] = [];
    for (const d of digests) {
      const hex = digestHex(d);
      if (hex === null || !this.lazyLayers.has(hex) || this.lazy === undefined) continue;
      if (await this.lazy.recordProfile(hex)) stored.push(`sha256:${hex}`);
    }
    return stored;
  }

  /** Bytes the lazy servers of these layers fetched (shared by every sandbox that uses them). */
  async fetchedBytes(digests: readonly string[]): Promise<number> {
    let n = 0;
    for (const d of digests) {
      const hex = digestHex(d);
      if (hex === null || !this.lazyLayers.has(hex) || this.lazy === undefined) continue;
      n += (await this.lazy.serverStats(hex))?.fetchedBytes ?? 0;
    }
    return n;
  }

  /** All layers, oldest first, optionally of one kind. */
  async list(filter?: { kind?: LayerKind }): Promise<LayerInfo[]> {
    await this.init();
    return [...this.layers.keys()]
      .map((hex) => this.info(hex))
      .filter((l) => filter?.kind === undefined || l.kind === filter.kind)
      .sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.digest.localeCompare(b.digest));
  }

  /** Points `name` (moved if it pointed elsewhere) at the layer `ref`. */
  async tag(ref: string, name: string): Promise<LayerInfo> {
    await this.init();
    const full = normalizeLayerName(name);
    return this.locked(async () => {
      const hex = this.hexOf(ref);
      this.names.set(full, hex);
      await this.saveNames();
      return this.info(hex);
    });
  }

  /** Drops a name; the layer stays until removed or collected. */
  async untag(name: string): Promise<void> {
    await this.init();
    const full = normalizeLayerName(name);
    await this.locked(async () => {
      if (!this.names.delete(full)) throw new DsecError('LAYER_NOT_FOUND', `no layer named ${full}`, { layer: name });
      await this.saveNames();
    });
  }

  /** Deletes a layer and every name pointing at it; CONFLICT while a sandbox uses it. */
  async remove(ref: string): Promise<void> {
    await this.init();
    await this.locked(async () => {
      const hex = this.hexOf(ref);
      if ((this.refs.get(hex) ?? 0) > 0) {
        throw new DsecError('CONFLICT', `layer sha256:${hex} is in use by ${this.refs.get(hex)} sandbox(es)`, { layer: ref });
      }
      if (!this.tryUnmount(hex)) throw new DsecError('CONFLICT', `layer sha256:${hex} is mounted and busy`, { layer: ref });
      for (const [name, target] of this.names) if (target === hex) this.names.delete(name);
      await this.saveNames();
      await this.deleteLayer(hex);
    });
  }

  /**
   * Mounts the layer (once per node; an existing mount, also one left by a previous edge
   * process, is reused), counts one more user, and returns the read-only mount directory.
   */
  async acquire(digest: string): Promise<string> {
    await this.init();
    return this.locked(async () => {
      const hex = this.hexOf(digest);
      const target = join(this.mntDir, hex);
      this.cancelLinger(hex);
      // A lazy layer whose server died reads ENOTCONN: it is mounted anew for this user.
      if (this.mounted.has(hex) && this.lazy !== undefined && this.lazyLayers.has(hex) && (await this.lazy.gone(hex))) await this.dropDeadMount(hex);
      // A disk layer is a VM's image file: counted, never mounted.
      if (!this.mounted.has(hex) && this.layers.get(hex)?.kind !== 'disk') {
        await mkdir(target, { recursive: true });
        if (!(await mountsUnder(target)).includes(target)) {
          const dir = join(this.blobsDir, hex);
          let blob = join(dir, BLOB_FILE);
          if (this.lazy !== undefined && this.lazyLayers.has(hex)) {
            this.cancelIdleLazy(hex);
            await this.lazyStops.get(hex);
            // An idle server (kept since the last unmount) is found running and serves again.
            blob = await this.lazy.start(hex, dir);
          }
          try {
            mount(join(dir, META_FILE), target, 'erofs', MS.RDONLY | MS.NODEV, `device=${blob}`);
          } catch (err) {
            if (blob !== join(dir, BLOB_FILE)) this.stopLazy(hex);
            throw err;
          }
        }
        this.mounted.add(hex);
      }
      this.refs.set(hex, (this.refs.get(hex) ?? 0) + 1);
      if (this.evictable.has(hex)) {
        const now = Date.now();
        this.evictable.set(hex, now);
        // The marker's mtime carries the last use across edge restarts.
        await utimes(join(this.blobsDir, hex, IN_REGISTRY_FILE), now / 1000, now / 1000).catch(() => undefined);
      }
      return target;
    });
  }

  /**
   * The files of a stored layer: its EROFS metadata image and its data blob (a microVM attaches
   * them as read-only disks instead of mounting them on the host).
   */
  imageFiles(digest: string): { meta: string; blob: string } {
    const dir = join(this.blobsDir, this.hexOf(digest));
    return { meta: join(dir, META_FILE), blob: join(dir, BLOB_FILE) };
  }

  /** Where a layer is mounted while it is acquired (read-only; its files as the layer holds them). */
  mountDir(digest: string): string {
    return join(this.mntDir, this.hexOf(digest));
  }

  /** One user fewer; at zero the layer is unmounted (after the linger time). */
  async release(digest: string): Promise<void> {
    await this.init();
    await this.locked(async () => {
      const hex = this.hexOf(digest);
      const n = (this.refs.get(hex) ?? 0) - 1;
      if (n > 0) {
        this.refs.set(hex, n);
        return;
      }
      this.refs.delete(hex);
      if (this.lingerMs <= 0) {
        this.tryUnmount(hex, true);
        return;
      }
      this.cancelLinger(hex);
      const timer = setTimeout(() => {
        this.lingering.delete(hex);
        this.locked(async () => {
          if ((this.refs.get(hex) ?? 0) === 0) this.tryUnmount(hex, true);
        }).catch(() => undefined); // a busy mount simply stays; the next release or close retries
      }, this.lingerMs);
      timer.unref();
      this.lingering.set(hex, timer);
    });
  }

  /** Deletes every layer that has no name and no user; returns their digests. */
  async gc(): Promise<LayerGcResult> {
    await this.init();
    return this.locked(async () => {
      const named = new Set(this.names.values());
      const removed: string[] = [];
      for (const hex of [...this.layers.keys()]) {
        if (named.has(hex) || (this.refs.get(hex) ?? 0) > 0) continue;
        if (!this.tryUnmount(hex)) continue;
        await this.deleteLayer(hex);
        removed.push(`sha256:${hex}`);
      }
      return { removed };
    });
  }

  /**
   * Unmounts layers that are mounted but have no user and no linger timer: mounts a previous
   * edge process left for sandboxes that are gone. Returns how many were unmounted.
   */
  async unmountUnused(): Promise<number> {
    await this.init();
    return this.locked(async () => {
      let n = 0;
      for (const hex of [...this.mounted]) {
        if ((this.refs.get(hex) ?? 0) > 0 || this.lingering.has(hex)) continue;
        if (this.tryUnmount(hex, true)) n++;
      }
      return n;
    });
  }

  /**
   * Drops this process's pending unmounts and leaves every mount in place, for the next edge on
   * this state directory to adopt (an edge that closes without shutting down). A timer left
   * running would unmount a layer that the next edge already counts as mounted.
   */
  detach(): void {
    for (const timer of this.lingering.values()) clearTimeout(timer);
    this.lingering.clear();
    for (const timer of this.lazyIdle.values()) clearTimeout(timer);
    this.lazyIdle.clear();
    this.lazy?.detach();
  }

  /** Unmounts every layer mount of this store that is not busy (shutdown and tests). */
  async close(): Promise<void> {
    if (this.initialized === undefined) return;
    await this.init();
    await this.locked(async () => {
      for (const timer of this.lingering.values()) clearTimeout(timer);
      this.lingering.clear();
      this.refs.clear();
      for (const hex of [...this.mounted]) this.tryUnmount(hex);
      for (const hex of [...this.lazyIdle.keys()]) {
        this.cancelIdleLazy(hex);
        if (!this.mounted.has(hex)) this.stopLazy(hex);
      }
    });
    await this.settled();
    this.lazy?.detach();
  }

  private info(hex: string): LayerInfo {
    const layer = this.layers.get(hex);
    if (layer === undefined) throw new DsecError('LAYER_NOT_FOUND', `no layer sha256:${hex}`, { layer: `sha256:${hex}` });
    const names = [...this.names]
      .filter(([, h]) => h === hex)
      .map(([n]) => n)
      .sort();
    return { ...layer, labels: { ...layer.labels }, names };
  }

  private hexOf(ref: string): string {
    const hex = digestHex(ref);
    if (hex !== null) {
      if (this.layers.has(hex)) return hex;
    } else {
      let full: string | undefined;
      try {
        full = normalizeLayerName(ref, 'layer');
      } catch {
        full = undefined;
      }
      const target = full === undefined ? undefined : this.names.get(full);
      if (target !== undefined) return target;
    }
    throw new DsecError('LAYER_NOT_FOUND', `no layer ${ref}`, { layer: ref });
  }

  /**
   * Unmounts the layer if mounted; false when the mount is busy. A lazy layer's server stops,
   * or with `idle` (the last user went; the layer stays on the node) is kept for a while.
   */
  private tryUnmount(hex: string, idle = false): boolean {
    this.cancelLinger(hex);
    if (!this.mounted.has(hex)) {
      if (!idle && this.lazyIdle.has(hex)) this.stopLazy(hex);
      return true;
    }
    try {
      umount(join(this.mntDir, hex));
    } catch (err) {
      if (err instanceof SyscallError && err.errno === EBUSY) return false;
      throw err;
    }
    this.mounted.delete(hex);
    if (this.lazyLayers.has(hex)) {
      if (idle) this.idleLazy(hex);
      else this.stopLazy(hex);
    }
    return true;
  }

  /**
   * A lazy layer mounted over a server that died: its EROFS mount reads through a FUSE
   * connection that is gone, ENOTCONN for every chunk not in the page cache, for good. A FUSE
   * mount cannot be re-attached to a new server, and the overlays of the sandboxes using the
   * layer hold this mount (not its path): they cannot be moved to a new one. So the mount is
   * detached (new users get a new server and mount, see {@link acquire}) and `layer.server-lost`
   * names the layer, for the edge to mark the sandboxes using it lost. Called locked.
   */
  private async dropDeadMount(hex: string): Promise<void> {
    if (!this.mounted.has(hex) || this.lazy === undefined) return;
    umount(join(this.mntDir, hex), MNT.DETACH);
    this.mounted.delete(hex);
    await this.lazyStops.get(hex);
    await this.lazy.stop(hex);
    this.lostLayers.add(`sha256:${hex}`);
    this.opts.lazy?.raise?.({
      kind: 'layer.server-lost',
      severity: 'warning',
      message: `layer sha256:${hex}: its lazy server died; the sandboxes using it cannot read it any more and are lost, later ones get a new server`,
      data: { layer: `sha256:${hex}`, users: this.refs.get(hex) ?? 0 },
    });
  }

  /**
   * Layers whose lazy server was found dead (by this edge, or when it started): the edge marks
   * the sandboxes using them lost. Each is handed out once.
   */
  takeLostLayers(): string[] {
    const out = [...this.lostLayers];
    this.lostLayers.clear();
    return out;
  }

  /**
   * Keeps an unmounted lazy layer's server (its FUSE view of the blob, with the blob's page
   * cache) for `lazy.serverIdleMs`, so that the layer's next user mounts it at once instead of
   * starting a server (a Node process, a FUSE mount) and reading every chunk through FUSE again;
   * then stops it. Its chunks stay pinned meanwhile. Called locked.
   */
  private idleLazy(hex: string): void {
    this.cancelIdleLazy(hex);
    const idleMs = this.opts.lazy?.serverIdleMs ?? DEFAULT_LAZY_SERVER_IDLE_MS;
    if (idleMs <= 0) {
      this.stopLazy(hex);
      return;
    }
    const timer = setTimeout(() => {
      this.lazyIdle.delete(hex);
      this.locked(async () => {
        if (!this.mounted.has(hex) && !this.lazyIdle.has(hex)) this.stopLazy(hex);
      }).catch(() => undefined);
    }, idleMs);
    timer.unref();
    this.lazyIdle.set(hex, timer);
  }

  private cancelIdleLazy(hex: string): void {
    clearTimeout(this.lazyIdle.get(hex));
    this.lazyIdle.delete(hex);
  }

  /** Stops a lazy layer's server in the background (an acquire waits for it). */
  private stopLazy(hex: string): void {
    this.cancelIdleLazy(hex);
    const lazy = this.lazy;
    if (lazy === undefined || this.lazyStops.has(hex)) return;
    const stop = lazy.stop(hex).finally(() => this.lazyStops.delete(hex));
    this.lazyStops.set(
      hex,
      stop.catch(() => undefined),
    );
  }

  /** Waits for the lazy servers being stopped (close, tests). */
  async settled(): Promise<void> {
    await Promise.all([...this.lazyStops.values()]);
  }

  private cancelLinger(hex: string): void {
    const timer = this.lingering.get(hex);
    if (timer !== undefined) clearTimeout(timer);
    this.lingering.delete(hex);
  }

  private async deleteLayer(hex: string): Promise<void> {
    // Rename first so that a crash mid-delete leaves only a temp dir, which init removes.
    const doomed = join(this.tmpDir, `delete-${hex}-${randomBytes(4).toString('hex')}`);
    await rename(join(this.blobsDir, hex), doomed);
    this.layers.delete(hex);
    this.evictable.delete(hex);
    this.lazyLayers.delete(hex);
    await rm(doomed, { recursive: true, force: true });
    await rmdir(join(this.mntDir, hex)).catch(() => undefined);
  }

  private async writeInfo(hex: string): Promise<void> {
    await atomicWrite(join(this.blobsDir, hex, INFO_FILE), JSON.stringify(this.info(hex), null, 2));
  }

  private async saveNames(): Promise<void> {
    const obj: Record<string, string> = {};
    for (const [name, hex] of [...this.names].sort((a, b) => a[0].localeCompare(b[0]))) obj[name] = `sha256:${hex}`;
    await atomicWrite(join(this.root, NAMES_FILE), JSON.stringify(obj, null, 2) + '\n');
  }

  /** Runs `fn` after every earlier locked call: index and mount changes are serialized. */
  private locked<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => undefined);
    return run;
  }
}

async function exists(path: string): Promise<boolean> {
  return access(path).then(
    () => true,
    () => false,
  );
}

async function atomicWrite(path: string, text: string): Promise<void> {
  const tmp = `${path}.tmp-${randomBytes(4).toString('hex')}`;
  await writeFile(tmp, text);
  await rename(tmp, path);
}

/** Removes a directory tree, first detaching anything mounted inside it (a crashed build's). */
async function safeRemove(dir: string): Promise<void> {
  for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
  await rm(dir, { recursive: true, force: true });
}

/**
 * Number of entries below `dir` and bytes of regular-file content (hard links once), counted in
 * the host-read pool without following any symlink: for a snapshot `dir` is a sandbox's writable
 * layer, which may hold anything.
 */
async function countTree(dir: string, signal?: AbortSignal): Promise<{ files: number; contentBytes: number }> {
  return (await readPool().run({ op: 'count-tree', root: dir }, signal)) as { files: number; contentBytes: number };
}
