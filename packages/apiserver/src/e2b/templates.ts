// E2B's `templateID` in dsec terms: a layer name or digest of the project (an image base), a
// snapshot (its digest or name), or `base`: a Debian image close to E2B's own base template,
// built in the background when the platform starts and named by what it is made of, so a node
// that holds it never builds it again. A create before it is ready is 503 with Retry-After.
import { createHash } from 'node:crypto';
import tar from 'tar-stream';
import { DsecError } from '@dsec/protocol';
import type { CreateSandboxRequest } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { PUBLIC_PROJECT_ID, ROOT_PROJECT_ID } from '../db/store.js';
import type { Services } from '../services/index.js';
import { E2bError } from './errors.js';

/** Packages of the `base` template (E2B's base: bash, coreutils, sudo, python3 + python, git, curl, ncurses). */
export const BASE_PACKAGES = ['bash', 'coreutils', 'sudo', 'python3', 'python-is-python3', 'git', 'curl', 'ca-certificates', 'ncurses-bin', 'procps'];
/** Debian suite of the `base` template. */
export const BASE_SUITE = 'bookworm';
/** Seconds a client is told to wait while `base` builds. */
export const BASE_RETRY_AFTER_S = 30;

/** The alias E2B clients use for the default template. */
export const BASE_ALIAS = 'base';

/**
 * The build key of `base`: its packages, suite and month (a new month builds against the
 * archive as it is then; the same month reuses the layer a node already holds).
 */
export function baseKey(now = new Date()): string {
  const month = now.toISOString().slice(0, 7);
  return createHash('sha256')
    .update(`${BASE_SUITE}\n${BASE_PACKAGES.join(',')}\n${month}`)
    .digest('hex')
    .slice(0, 16);
}

const PASSWD = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
bin:x:2:2:bin:/bin:/usr/sbin/nologin
sys:x:3:3:sys:/dev:/usr/sbin/nologin
sync:x:4:65534:sync:/bin:/bin/sync
games:x:5:60:games:/usr/games:/usr/sbin/nologin
man:x:6:12:man:/var/cache/man:/usr/sbin/nologin
lp:x:7:7:lp:/var/spool/lpd:/usr/sbin/nologin
mail:x:8:8:mail:/var/mail:/usr/sbin/nologin
news:x:9:9:news:/var/spool/news:/usr/sbin/nologin
uucp:x:10:10:uucp:/var/spool/uucp:/usr/sbin/nologin
proxy:x:13:13:proxy:/bin:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
backup:x:34:34:backup:/var/backups:/usr/sbin/nologin
list:x:38:38:Mailing List Manager:/var/list:/usr/sbin/nologin
irc:x:39:39:ircd:/run/ircd:/usr/sbin/nologin
_apt:x:42:65534::/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
user:x:1000:1000::/home/user:/bin/bash
`;
const GROUP_NAMES: Array<[string, number]> = [
  ['root', 0], ['daemon', 1], ['bin', 2], ['sys', 3], ['adm', 4], ['tty', 5], ['disk', 6], ['lp', 7], ['mail', 8], ['news', 9],
  ['uucp', 10], ['man', 12], ['proxy', 13], ['kmem', 15], ['dialout', 20], ['fax', 21], ['voice', 22], ['cdrom', 24], ['floppy', 25],
  ['tape', 26], ['sudo', 27], ['audio', 29], ['dip', 30], ['www-data', 33], ['backup', 34], ['operator', 37], ['list', 38], ['irc', 39],
  ['src', 40], ['shadow', 42], ['utmp', 43], ['video', 44], ['sasl', 45], ['plugdev', 46], ['staff', 50], ['games', 60], ['users', 100],
  ['nogroup', 65534], ['user', 1000],
]; // prettier-ignore

/** The `user` account of the base template as a toolkit layer tar (passwd, group, shadow, sudoers, home). */
export function baseUserTar(): AsyncIterable<Uint8Array> {
  const pack = tar.pack();
  const members: Record<string, string> = { sudo: 'user', users: 'user' };
  const group = GROUP_NAMES.map(([n, g]) => `${n}:x:${g}:${members[n] ?? ''}\n`).join('');
  const shadow = PASSWD.split('\n')
    .filter((l) => l)
    .map((l) => `${l.split(':')[0]}:*:19700:0:99999:7:::\n`)
    .join('');
  const mtime = new Date(0);
  const file = (name: string, body: string, mode: number, gid = 0): void => void pack.entry({ name, mode, uid: 0, gid, mtime }, body);
  pack.entry({ name: 'etc', type: 'directory', mode: 0o755, mtime });
  file('etc/passwd', PASSWD, 0o644);
  file('etc/group', group, 0o644);
  file('etc/shadow', shadow, 0o640, 42);
  pack.entry({ name: 'etc/sudoers.d', type: 'directory', mode: 0o750, mtime });
  file('etc/sudoers.d/user', 'user ALL=(ALL:ALL) NOPASSWD: ALL\n', 0o440);
  pack.entry({ name: 'home', type: 'directory', mode: 0o755, mtime });
  pack.entry({ name: 'home/user', type: 'directory', mode: 0o750, uid: 1000, gid: 1000, mtime });
  file('home/user/.bashrc', 'PS1="\\u@e2b:\\w$ "\n', 0o644);
  pack.finalize();
  return pack as unknown as AsyncIterable<Uint8Array>;
}

/** What a template becomes in a dsec create request. */
export type TemplateSource = Pick<CreateSandboxRequest, 'image' | 'snapshot'>;

/** Options of {@link TemplateResolver}. */
export interface TemplateOptions {
  /** Build `base` on its first request when it is not built yet (default true). */
  buildOnDemand?: boolean;
  /**
   * A layer (name or digest, public or the root project's) to use as the Debian part of `base`
   * instead of building it: an operator's own image; tests use a small local one, so that no
   * test reaches the Debian archive. The `user` toolkit is still built over it.
   */
  baseFrom?: string;
  log?: (line: string) => void;
}

/** Resolves `templateID`s; builds `base` once. */
export class TemplateResolver {
  private building: Promise<void> | undefined;
  private failed: string | undefined;
  private ready = false;
  private readonly abort = new AbortController();

  constructor(
    private readonly services: Services,
    private readonly opts: TemplateOptions = {},
  ) {}

  /** Layer names of `base` (its Debian layer, its `user` toolkit). */
  static baseNames(key = baseKey()): { base: string; user: string } {
    return { base: `e2b/base-${key}`, user: `e2b/base-user-${key}` };
  }

  /** The layers of `base` in this platform: the Debian part (or the operator's), its `user` toolkit. */
  private names(): { base: string; user: string } {
    const n = TemplateResolver.baseNames();
    return this.baseFromDigest ? { ...n, base: this.baseFromDigest } : n;
  }

  /** The digest of `baseFrom` (resolved in the root project, whose layers every project sees). */
  private baseFromDigest: string | undefined;

  /** Starts building `base` in the background unless the node has it. */
  start(): void {
    if (this.building || this.ready) return;
    this.failed = undefined;
    this.building = this.build()
      .then(() => {
        this.ready = true;
      })
      .catch((err: unknown) => {
        this.failed = (err as Error).message;
        this.opts.log?.(`e2b: building the base template failed: ${this.failed}`);
      })
      .finally(() => {
        this.building = undefined;
      });
  }

  /** Stops a build under way (platform shutdown). */
  async close(): Promise<void> {
    this.abort.abort(new DsecError('CANCELLED', 'the platform is stopping'));
    await this.building;
  }

  private async build(): Promise<void> {
    const { layers } = this.services;
    const names = this.names();
    const edge = layers.anyEdge();
    const signal = this.abort.signal;
    const have = async (n: string): Promise<boolean> => !!(await edge.layers.resolve(n).catch(() => undefined));
    if (this.opts.baseFrom) {
      this.baseFromDigest = await layers.resolve(ROOT_PROJECT_ID, this.opts.baseFrom, 'baseFrom');
    } else if (!(await have(names.base))) {
      const info = await edge.layers.build(
        { type: 'debian', suite: BASE_SUITE, packages: BASE_PACKAGES, variant: 'apt' },
        // Through the node's machine-wide cache (as the fncall runtimes): a new home on the machine takes it at once.
        { kind: 'base', name: names.base, signal, machineCache: true, onProgress: (l) => this.opts.log?.(`e2b base: ${l}`) },
      );
      await layers.register(PUBLIC_PROJECT_ID, info, names.base);
    } else await this.registerPublic(names.base);
    if (!(await have(names.user))) {
      const info = await edge.layers.build({ type: 'tar', stream: baseUserTar() }, { kind: 'toolkit', name: names.user, signal });
      await layers.register(PUBLIC_PROJECT_ID, info, names.user);
    } else await this.registerPublic(names.user);
  }

  /** Records a layer the node already holds as public (a new home over a node's old store). */
  private async registerPublic(name: string): Promise<void> {
    const { layers } = this.services;
    const known = await layers.resolve(PUBLIC_PROJECT_ID, name, 'templateID').catch(() => undefined);
    if (!known) await layers.register(PUBLIC_PROJECT_ID, await layers.anyEdge().layers.resolve(name), name);
  }

  /** A create's image or snapshot for `templateID`; 503 + Retry-After while `base` builds. */
  async resolve(p: Principal, templateID: string): Promise<TemplateSource> {
    if (templateID === BASE_ALIAS) {
      if (!this.ready) {
        if (this.opts.buildOnDemand !== false) this.start();
        const why = this.failed ? `its last build failed (${this.failed}); building again` : 'it is being built';
        throw new E2bError(503, `template base is not ready yet: ${why}; retry in ${BASE_RETRY_AFTER_S} s`, BASE_RETRY_AFTER_S);
      }
      const names = this.names();
      return { image: { base: names.base, toolkits: [names.user] } };
    }
    const ref = /^[0-9a-f]{64}$/.test(templateID) ? `sha256:${templateID}` : templateID;
    let digest: string;
    try {
      digest = await this.services.layers.resolve(p.projectId, ref, 'templateID');
    } catch (err) {
      if (err instanceof DsecError && (err.code === 'LAYER_NOT_FOUND' || err.code === 'INVALID_ARGUMENT' || err.code === 'NOT_FOUND'))
        throw new E2bError(404, `template ${templateID} not found`);
      throw err;
    }
    const layer = await this.services.layers.get(p, digest);
    if (layer.kind === 'snapshot') return { snapshot: digest };
    if (layer.kind !== 'base') throw new E2bError(400, `template ${templateID} is a ${layer.kind} layer, not an image base or a snapshot`);
    return { image: { base: digest } };
  }
}
