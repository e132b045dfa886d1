// Podman beside dsec: a layer's root as a one-layer OCI image (a gzip tar, the usual registry
// format), pushed to a registry, then `podman pull` + `podman run` of it with podman's storage in
// a directory of the bench's own (`--root`/`--runroot`), made and removed per run, so that every
// pull is cold and the machine's shared podman storage is never touched.
import { execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import { createGzip } from 'node:zlib';
import { MNT, mountsUnder, RegistryClient, umount } from '@dsec/edge';
import type { LayerStore } from '@dsec/edge';
import type { LayerInfo } from '@dsec/protocol';
import { onCleanup } from './cleanup.js';
import { PODMAN_ULIMITS } from './peers.js';
import { nowMs, sleep } from './stats.js';

const run = promisify(execFile);

/** The image's gzip layer in the bench cache: its digest, size, and the digest of the tar inside. */
interface CachedOciLayer {
  file: string;
  digest: string;
  size: number;
  diffId: string;
}

/** Where a layer's root is mounted from (a node's layer store). */
type LayerMounts = Pick<LayerStore, 'acquire' | 'release'>;

/** A registry and its credentials (Basic auth), as podman and the push reach it. */
export interface PodmanRegistry {
  url: string;
  username: string;
  password: string;
}

/**
 * The gzip tar of `layer`'s root (a base layer mounted through `layers`), made once into
 * `<cacheDir>/podman/<layer hex>/` (keyed by the layer's digest) and taken from there afterwards.
 */
export async function cachedOciLayer(cacheDir: string, layers: LayerMounts, layer: LayerInfo, onProgress: (m: string) => void): Promise<CachedOciLayer> {
  const dir = path.join(cacheDir, 'podman', layer.digest.slice('sha256:'.length));
  const file = path.join(dir, 'layer.tar.gz');
  const record = path.join(dir, 'layer.json');
  const known = await readFile(record, 'utf8')
    .then((s) => JSON.parse(s) as Omit<CachedOciLayer, 'file'>)
    .catch(() => undefined);
  if (known && (await stat(file).catch(() => undefined))?.size === known.size) return { file, ...known };
  onProgress(`podman: making the gzip tar of ${layer.digest.slice(0, 19)} for the OCI image (once, into ${dir})`);
  await mkdir(dir, { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  try {
    const root = await layers.acquire(layer.digest);
    try {
      const tar = spawn('tar', ['--numeric-owner', '--xattrs', '--xattrs-include=*', '-C', root, '-cf', '-', '.'], { stdio: ['ignore', 'pipe', 'inherit'] });
      const exited = new Promise<void>((resolve, reject) => {
        tar.once('error', reject);
        tar.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`tar of ${root} exited with ${code}`))));
      });
      const tarHash = createHash('sha256');
      const gzHash = createHash('sha256');
      let size = 0;
      const tap = (hash: ReturnType<typeof createHash>, count: boolean) =>
        new Transform({
          transform(chunk: Buffer, _enc, done) {
            hash.update(chunk);
            if (count) size += chunk.length;
            done(null, chunk);
          },
        });
      await Promise.all([pipeline(tar.stdout, tap(tarHash, false), createGzip(), tap(gzHash, true), createWriteStream(tmp)), exited]);
      const entry = { digest: `sha256:${gzHash.digest('hex')}`, size, diffId: `sha256:${tarHash.digest('hex')}` };
      await rename(tmp, file);
      await writeFile(record, JSON.stringify(entry));
      return { file, ...entry };
    } finally {
      await layers.release(layer.digest);
    }
  } finally {
    await rm(tmp, { force: true });
  }
}

/**
 * Pushes `layer`'s root to `registry` as the OCI image `<repo>:<tag>` (one gzip layer, a config
 * running `sh`); returns the reference podman pulls and the image's compressed size.
 */
export async function pushAsOciImage(
  registry: PodmanRegistry,
  repo: string,
  tag: string,
  cacheDir: string,
  layers: LayerMounts,
  layer: LayerInfo,
  onProgress: (m: string) => void,
): Promise<{ ref: string; bytes: number }> {
  const gz = await cachedOciLayer(cacheDir, layers, layer, onProgress);
  const rc = new RegistryClient(registry);
  await rc.pushBlob(repo, gz.digest, gz.file, gz.size);
  const config = Buffer.from(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], Cmd: ['sh'] },
      rootfs: { type: 'layers', diff_ids: [gz.diffId] },
    }),
  );
  const configDigest = `sha256:${createHash('sha256').update(config).digest('hex')}`;
  const scratch = await mkdtemp(path.join(cacheDir, 'podman', '.config-'));
  try {
    await writeFile(path.join(scratch, 'config.json'), config);
    await rc.pushBlob(repo, configDigest, path.join(scratch, 'config.json'), config.length);
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
  const manifest = {
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: configDigest, size: config.length },
    layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', digest: gz.digest, size: gz.size }],
  };
  await rc.putManifest(repo, tag, manifest.mediaType, Buffer.from(JSON.stringify(manifest)));
  return { ref: `${rc.host}/${repo}:${tag}`, bytes: gz.size + config.length };
}

/** Whether podman can run here (the scenario records no podman rows otherwise). */
export async function podmanVersion(): Promise<string | undefined> {
  return run('podman', ['--version']).then(
    (r) => r.stdout.trim(),
    () => undefined,
  );
}

/**
 * One cold `podman pull` of `ref` then `podman run --rm` of `cmd` in it, with podman's storage in
 * a new directory under `dir` (removed afterwards, its mounts first), then the same run again
 * (a warm start, the image local). Times in ms.
 */
export async function podmanPullRun(
  dir: string,
  registry: PodmanRegistry,
  ref: string,
  cmd: string[],
  /** Called between the cold run's end and the warm run (before the warm run's time). */
  afterCold: () => Promise<void>,
  /** The peers' runtime namespace prefix (`Peers.prefix`): crun refuses hybrid cgroups outside it. */
  prefix: readonly string[],
): Promise<{ pullMs: number; runMs: number; ms: number; warmMs: number }> {
  const podman = (args: string[], options: Parameters<typeof run>[2]): ReturnType<typeof run> =>
    prefix.length > 0 ? run(prefix[0]!, [...prefix.slice(1), 'podman', ...args], options) : run('podman', args, options);
  const home = await mkdtemp(path.join(dir, 'podman-'));
  const global = [
    '--root',
    path.join(home, 'root'),
    '--runroot',
    path.join(home, 'run'),
    '--tmpdir',
    path.join(home, 'tmp'),
    '--storage-driver',
    'overlay',
    '--cgroup-manager',
    'cgroupfs',
    '--events-backend',
    'file',
  ];
  // `podman run --rm` returns before podman's own container cleanup (started by conmon) has let
  // go of the storage: unmount and remove again until it has (at most 30 s).
  const done = onCleanup(`podman storage ${home}`, async () => {
    for (let attempt = 0; ; attempt++) {
      for (const m of (await mountsUnder(home).catch(() => [] as string[])).reverse()) {
        try {
          umount(m, MNT.DETACH);
        } catch {
          // gone meanwhile
        }
      }
      try {
        await rm(home, { recursive: true, force: true });
        return;
      } catch (err) {
        if (attempt >= 120) throw err;
        await sleep(250);
      }
    }
  });
  // No auth file of the machine's is read (an empty one of its own): the credentials are on the command line.
  const env = { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', HOME: home, REGISTRY_AUTH_FILE: path.join(home, 'auth.json') };
  try {
    await mkdir(home, { recursive: true });
    await writeFile(env.REGISTRY_AUTH_FILE, '{"auths":{}}\n', { mode: 0o600 });
    const t0 = nowMs();
    await podman([...global, 'pull', '--quiet', '--tls-verify=false', '--creds', `${registry.username}:${registry.password}`, ref], {
      env,
      maxBuffer: 16 * 1024 * 1024,
    });
    const pullMs = nowMs() - t0;
    // podman (as root) raises open files and processes to 1048576 unless told, which crun cannot
    // do where the bench runs without CAP_SYS_RESOURCE: the same limits as the other podman rows.
    const runArgs = [...global, 'run', '--rm', '--pull', 'never', '--network', 'none', ...PODMAN_ULIMITS, ref, ...cmd];
    await podman(runArgs, { env, maxBuffer: 16 * 1024 * 1024 });
    const ms = nowMs() - t0;
    await afterCold();
    // A warm start: the same run again, the image in podman's storage.
    const t1 = nowMs();
    await podman(runArgs, { env, maxBuffer: 16 * 1024 * 1024 });
    return { pullMs, runMs: ms - pullMs, ms, warmMs: nowMs() - t1 };
  } finally {
    await done();
  }
}
