// A network namespace reachable from the host over a veth pair: `address` inside as eth0,
// `hostAddress` on the host's end (a /30), loopback up, optionally a default route through the
// host. Tests and benches put servers in it that stand in for remote ones (upstreams, registries).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Names of a namespace link: the namespace, the host-side interface and the /30's two addresses. */
export interface NamespaceLink {
  ns: string;
  hostIf: string;
  /** The host's end. */
  hostAddress: string;
  /** The namespace's end (its eth0). */
  address: string;
}

/** Makes the namespace and its link; on a failure what was made is removed before the error. */
export async function makeNamespaceLink(link: NamespaceLink, opts: { defaultRoute?: boolean } = {}): Promise<void> {
  const { ns, hostIf, hostAddress, address } = link;
  await run('ip', ['netns', 'add', ns]);
  try {
    await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    await run('ip', ['addr', 'add', `${hostAddress}/30`, 'dev', hostIf]);
    await run('ip', ['link', 'set', hostIf, 'up']);
    for (const args of [
      ['addr', 'add', `${address}/30`, 'dev', 'eth0'],
      ['link', 'set', 'lo', 'up'],
      ['link', 'set', 'eth0', 'up'],
      ...(opts.defaultRoute === true ? [['route', 'add', 'default', 'via', hostAddress]] : []),
    ])
      await run('ip', ['-n', ns, ...args]);
  } catch (err) {
    await removeNamespaceLink(link);
    throw err;
  }
}

/** Removes the namespace and the host's end of its link (what is already gone is no error). */
export async function removeNamespaceLink(link: Pick<NamespaceLink, 'ns' | 'hostIf'>): Promise<void> {
  await run('ip', ['netns', 'del', link.ns]).catch(() => undefined);
  await run('ip', ['link', 'del', link.hostIf]).catch(() => undefined);
}
