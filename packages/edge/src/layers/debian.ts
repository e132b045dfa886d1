// A Debian base layer made by mmdebstrap from the apt sources the host is configured with.
import { readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { DsecError } from '@dsec/protocol';
import { runTool } from './erofs.js';

/** Suite used when a Debian source names none. */
export const DEFAULT_DEBIAN_SUITE = 'bookworm';

/** Options of {@link buildDebianTree}. */
export interface DebianTreeOptions {
  suite: string;
  packages: string[];
  variant: 'minbase' | 'apt';
  signal?: AbortSignal | undefined;
  onProgress?: ((msg: string) => void) | undefined;
  /** Host apt configuration to take mirrors from; default `/etc/apt`. */
  aptDir?: string;
  /** More mmdebstrap options (`--dpkgopt=...`, hooks), placed before the suite. */
  extraArgs?: string[];
}

const PACKAGE_RE = /^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$/;
const SUITE_RE = /^[a-z][a-z0-9-]{1,63}$/;

/** One apt source: `deb [signed-by=K] URI SUITE COMPONENTS`. */
interface AptSource {
  uri: string;
  suites: string[];
  components: string[];
  signedBy?: string;
}

/** Runs mmdebstrap into `dest` (which must not exist or be empty), then drops apt caches. */
export async function buildDebianTree(dest: string, opts: DebianTreeOptions): Promise<void> {
  const { suite, packages, variant, signal, onProgress } = opts;
  if (!SUITE_RE.test(suite)) throw new DsecError('INVALID_ARGUMENT', `source.suite: not a suite name: ${suite}`, { field: 'source.suite' });
  for (const p of packages) {
    if (!PACKAGE_RE.test(p)) throw new DsecError('INVALID_ARGUMENT', `source.packages: not a package name: ${p}`, { field: 'source.packages' });
  }
  const mirrors = await hostMirrors(suite, opts.aptDir ?? '/etc/apt');
  onProgress?.(
    `mmdebstrap ${suite} (${variant}) with ${packages.length} package(s) from ${[...new Set(mirrors.map((m) => m.split(' ')[2] ?? ''))].join(', ') || 'the default mirror'}`,
  );
  const args = [`--variant=${variant}`, '--mode=root', '--format=directory'];
  if (packages.length > 0) args.push(`--include=${packages.join(',')}`);
  args.push(...(opts.extraArgs ?? []));
  args.push('--', suite, dest, ...mirrors);
  await runTool('mmdebstrap', args, signal, onProgress);
  await cleanApt(dest);
}

/**
 * The host's Debian apt sources rewritten for `suite`: entries for the host's own codename
 * (and its -updates / -security) become the same entries for `suite`. Empty when none
 * is found; mmdebstrap then falls back to its default mirror.
 */
export async function hostMirrors(suite: string, aptDir = '/etc/apt'): Promise<string[]> {
  const sources: AptSource[] = [];
  const main = await readFile(join(aptDir, 'sources.list'), 'utf8').catch(() => '');
  sources.push(...parseOneLine(main));
  const dir = join(aptDir, 'sources.list.d');
  for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) {
    const text = await readFile(join(dir, name), 'utf8').catch(() => '');
    if (name.endsWith('.list')) sources.push(...parseOneLine(text));
    else if (name.endsWith('.sources')) sources.push(...parseDeb822(text));
  }
  const codename = await hostCodename();
  const lines: string[] = [];
  for (const s of sources) {
    for (const hostSuite of s.suites) {
      const m = /^([a-z]+)(-updates|-security)?$/.exec(hostSuite);
      if (!m || (codename !== null && m[1] !== codename)) continue;
      const options = s.signedBy ? ` [signed-by=${s.signedBy}]` : '';
      lines.push(`deb${options} ${s.uri} ${suite}${m[2] ?? ''} ${s.components.join(' ')}`);
    }
  }
  return [...new Set(lines)];
}

async function hostCodename(): Promise<string | null> {
  const text = await readFile('/etc/os-release', 'utf8').catch(() => '');
  return /^VERSION_CODENAME=["']?([a-z]+)/m.exec(text)?.[1] ?? null;
}

function parseOneLine(text: string): AptSource[] {
  const out: AptSource[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.replace(/#.*/, '').trim();
    const m = /^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.+)$/.exec(line);
    if (!m) continue;
    const signedBy = /signed-by=(\S+)/.exec(m[1] ?? '')?.[1];
    out.push({ uri: m[2]!, suites: [m[3]!], components: m[4]!.split(/\s+/), ...(signedBy ? { signedBy } : {}) });
  }
  return out;
}

function parseDeb822(text: string): AptSource[] {
  const out: AptSource[] = [];
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    for (const line of stanza.split('\n')) {
      if (line.startsWith('#')) continue;
      const m = /^([A-Za-z-]+):\s*(.*)$/.exec(line);
      if (m) fields.set(m[1]!.toLowerCase(), m[2]!.trim());
    }
    if (!(fields.get('types') ?? '').split(/\s+/).includes('deb')) continue;
    if ((fields.get('enabled') ?? 'yes').toLowerCase() === 'no') continue;
    const signedBy = fields.get('signed-by');
    for (const uri of (fields.get('uris') ?? '').split(/\s+/).filter(Boolean)) {
      out.push({
        uri,
        suites: (fields.get('suites') ?? '').split(/\s+/).filter(Boolean),
        components: (fields.get('components') ?? 'main').split(/\s+/).filter(Boolean),
        ...(signedBy && signedBy.startsWith('/') ? { signedBy } : {}),
      });
    }
  }
  return out;
}

/** Removes package caches and indexes that only matter to apt at build time. */
async function cleanApt(root: string): Promise<void> {
  const clear = async (dir: string, keep: string[] = []) => {
    for (const name of await readdir(join(root, dir)).catch(() => [] as string[])) {
      if (!keep.includes(name)) await rm(join(root, dir, name), { recursive: true, force: true });
    }
  };
  await clear('var/cache/apt/archives', ['partial', 'lock']);
  await clear('var/lib/apt/lists', ['lock']);
  for (const name of await readdir(join(root, 'var/cache/apt')).catch(() => [] as string[])) {
    if (name.endsWith('.bin')) await rm(join(root, 'var/cache/apt', name), { force: true });
  }
  await clear('var/log/apt');
  await clear('tmp');
}
