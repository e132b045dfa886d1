// An RL-style episode on a Debian base with python3 and git and a workspace holding a real
// Python project with its tests: create, run the tests, modify a file, collect the diff,
// destroy. Episodes per minute at concurrency 8, vs the same loop with podman.
import { readdir, readFile, mkdir, cp } from 'node:fs/promises';
import path from 'node:path';
import { LayerStore } from '@dsec/edge';
import { Sandbox } from '@dsec/sdk';
import type { LayerInfo } from '@dsec/protocol';
import type { DsecClient } from '@dsec/sdk';
import { mustRun } from '../lib/peers.js';
import { retryRateLimited } from '../lib/platform.js';
import type { PreloadedLayer } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress, summarize } from '../lib/stats.js';

/** The Debian base: python3 and git, plus six, the project's one dependency. */
export const BASE_PACKAGES = ['python3', 'python3-six', 'git'];
/** Name of the cached base; it names the packages, so a change of the list builds a new one. */
export const BASE_NAME = `bench-${BASE_PACKAGES.join('-')}`;
/** The project: isodate, a small pure-Python library whose Debian package ships its unittest suite. */
const PROJECT_DEB = 'python3-isodate';
const WORKSPACE_NAME = 'bench-isodate';
const PROJECT_DIR = '/workspace';
const EDITED_FILE = 'isodate/isoerror.py';
const TEST_CMD = ['python3', '-m', 'unittest', 'discover', '-q', '-s', 'isodate/tests', '-t', '.'];

let cachedBase: LayerInfo | undefined;

/** The Debian base from the bench's persistent cache, built there on first use. */
export async function cachedDebianBase(cacheDir: string): Promise<{ info: LayerInfo; blobDir: string }> {
  const root = path.join(cacheDir, 'layers');
  const store = new LayerStore({ root });
  try {
    let info = await store.resolve(BASE_NAME).catch(() => undefined);
    if (!info) {
      progress(`episode: building the Debian base (${BASE_PACKAGES.join(', ')}) into ${root}; later runs reuse it`);
      const t0 = nowMs();
      info = await store.build({ type: 'debian', packages: BASE_PACKAGES }, { kind: 'base', name: BASE_NAME, onProgress: (m) => progress(`episode: ${m}`) });
      progress(`episode: Debian base built in ${((nowMs() - t0) / 1000).toFixed(1)} s`);
    }
    return { info, blobDir: path.join(root, 'blobs', info.digest.replace(/^sha256:/, '')) };
  } finally {
    await store.close();
  }
}

/** The project's .deb: from apt's cache, else the bench cache, else `apt-get download` (once). */
async function projectDeb(cacheDir: string): Promise<string> {
  const fromDir = async (dir: string): Promise<string | undefined> => {
    const name = (await readdir(dir).catch(() => [] as string[])).find((n) => n.startsWith(`${PROJECT_DEB}_`) && n.endsWith('.deb'));
    return name ? path.join(dir, name) : undefined;
  };
  const debs = path.join(cacheDir, 'debs');
  const found = (await fromDir('/var/cache/apt/archives')) ?? (await fromDir(debs));
  if (found) return found;
  await mkdir(debs, { recursive: true });
  progress(`episode: apt-get download ${PROJECT_DEB} into ${debs}`);
  await mustRun(['sh', '-c', `cd '${debs}' && apt-get download -q ${PROJECT_DEB}`]);
  const got = await fromDir(debs);
  if (!got) throw new Error(`apt-get download ${PROJECT_DEB} left no .deb`);
  return got;
}

/** Writes the workspace tree (project + git repository with one commit) under `root`. */
async function workspaceTree(root: string, deb: string): Promise<string> {
  const unpacked = path.join(root, '..', 'deb');
  await mkdir(unpacked, { recursive: true });
  await mustRun(['dpkg-deb', '-x', deb, unpacked]);
  const project = path.join(root, PROJECT_DIR.slice(1));
  await mkdir(project, { recursive: true });
  await cp(path.join(unpacked, 'usr/lib/python3/dist-packages/isodate'), path.join(project, 'isodate'), { recursive: true });
  const git = ['git', '-C', project, '-c', 'user.name=bench', '-c', 'user.email=bench@localhost'];
  await mustRun([...git, 'init', '-q']);
  await mustRun([...git, 'add', '-A']);
  await mustRun([...git, 'commit', '-q', '-m', `${PROJECT_DEB} as shipped by Debian`]);
  return project;
}

export const episodeScenario: Scenario = {
  name: 'episode',
  title: '6. RL-style episode',
  method: [
    `Base: a Debian bookworm root with ${BASE_PACKAGES.join(', ')} (six: isodate's one dependency), built once with the project's Debian builder`,
    "(mmdebstrap, ~25 s) into the bench's persistent cache (/var/tmp/dsec-bench-cache) and copied into the node's",
    'layer store before the run, as a node that has served this environment before would have it. Workspace: the',
    `isodate library with its own unittest suite (278 tests, standard library only, runs offline) from Debian's`,
    `\`${PROJECT_DEB}\` package (its binary package ships the tests), in a git repository committed at build time.`,
    'One episode: create the sandbox, run the test suite (must pass), rewrite a source file through the files API,',
    'collect `git diff` (must show the change), destroy. Episodes per minute with 8 running at once. podman runs',
    'the same loop (`run -d`, `exec` the tests, `exec -i` to write the file, `exec git diff`, `rm -f -t 0`) on an',
    'image imported from the same Debian root plus workspace.',
  ].join(' '),
  async prepare({ cacheDir }): Promise<PreloadedLayer[]> {
    const base = await cachedDebianBase(cacheDir);
    cachedBase = base.info;
    return [{ blobDir: base.blobDir }];
  },
  async run(ctx: ScenarioContext) {
    if (!cachedBase) throw new Error('episode: prepare() did not run');
    const { bench, peers } = ctx;
    await bench.adoptLayer(cachedBase, BASE_NAME);
    const wsRoot = path.join(ctx.dir, 'episode', 'root');
    const project = await workspaceTree(wsRoot, await projectDeb(ctx.cacheDir));
    await bench.admin.layers.uploadDir(wsRoot, { kind: 'workspace', name: WORKSPACE_NAME });
    const original = await readFile(path.join(project, EDITED_FILE), 'utf8');
    const edited = `# Edited by an episode.\n${original}`;

    // The podman image: the same Debian root (from the node's mounted layer) plus the workspace.
    const edge = bench.platform.edge;
    const baseDir = await edge.layers.acquire(cachedBase.digest);
    const tar = path.join(ctx.dir, 'episode', 'image.tar');
    try {
      await mustRun(['tar', '-cf', tar, '-C', baseDir, '.', '-C', wsRoot, PROJECT_DIR.slice(1)]);
    } finally {
      await edge.layers.release(cachedBase.digest);
    }
    const image = 'localhost/dsec-bench-episode:latest';
    progress('episode: importing the podman image');
    await peers.podman(['import', tar, image]);

    const concurrency = ctx.quick ? 2 : 8;
    const perRound = ctx.quick ? 2 : 24;
    const rounds = ctx.quick ? 1 : 2;
    const clients: DsecClient[] = await Promise.all(Array.from({ length: concurrency }, () => bench.newClient()));

    const dsecEpisode = async (w: number): Promise<number> => {
      const t0 = nowMs();
      const sb = await retryRateLimited(() =>
        Sandbox.create({ image: { base: BASE_NAME, workspace: WORKSPACE_NAME }, resources: { cpu: 1, memoryMiB: 512 } }, { client: clients[w]! }),
      );
      try {
        const tests = await sb.exec(TEST_CMD, { cwd: PROJECT_DIR });
        if (tests.exitCode !== 0) throw new Error(`tests failed in dsec: ${tests.stderr.slice(-300)}`);
        await sb.files.write(`${PROJECT_DIR}/${EDITED_FILE}`, edited);
        const diff = await sb.exec(['git', 'diff'], { cwd: PROJECT_DIR });
        if (!diff.stdout.includes('Edited by an episode'))
          throw new Error(`git diff in dsec missed the edit: ${diff.stdout.slice(0, 200)} ${diff.stderr.slice(0, 200)}`);
      } finally {
        await sb.kill();
      }
      return nowMs() - t0;
    };
    const podmanEpisode = async (): Promise<number> => {
      const t0 = nowMs();
      const name = await peers.podmanStartIdle(image);
      try {
        await peers.podmanExec(name, ['sh', '-c', `cd ${PROJECT_DIR} && exec ${TEST_CMD.join(' ')}`]);
        await peers.podmanExec(name, ['sh', '-c', `cat > ${PROJECT_DIR}/${EDITED_FILE}`], { stdin: edited });
        const diff = await peers.podmanExec(name, ['git', '-C', PROJECT_DIR, 'diff']);
        if (!diff.stdout.includes('Edited by an episode')) throw new Error('git diff in podman missed the edit');
      } finally {
        await peers.podmanRemove([name]);
      }
      return nowMs() - t0;
    };

    // Warm-up: one of each (page cache, first mounts).
    await dsecEpisode(0);
    await podmanEpisode();
    const stats = new Map<string, { episodes: number; ms: number; lat: number[] }>([
      ['dsec', { episodes: 0, ms: 0, lat: [] }],
      ['podman', { episodes: 0, ms: 0, lat: [] }],
    ]);
    for (let r = 0; r < rounds; r++) {
      for (const [name, fn] of [
        ['dsec', dsecEpisode],
        ['podman', podmanEpisode],
      ] as const) {
        const t0 = nowMs();
        const lat = await pool(perRound, concurrency, (_i, w) => fn(w));
        const s = stats.get(name)!;
        s.ms += nowMs() - t0;
        s.episodes += perRound;
        s.lat.push(...lat);
        progress(`episode: round ${r + 1}/${rounds}: ${name}: ${((perRound / (nowMs() - t0)) * 60_000).toFixed(0)} episodes/min`);
      }
    }
    for (const [name, s] of stats) {
      ctx.record({
        scenario: 'episode',
        metric: `episodes per minute, concurrency ${concurrency}`,
        system: name,
        unit: 'episodes/min',
        value: (s.episodes / s.ms) * 60_000,
        higherIsBetter: true,
        n: s.episodes,
      });
    }
    for (const [name, s] of stats) ctx.record(latencyRow('episode', 'episode duration (under that load)', name, summarize(s.lat)));
  },
};
