// A shaped link to a network namespace the bench makes: a veth pair (`<address>` inside as eth0,
// `<hostAddress>` on the host; edge's testing/netns-link.ts, shared with the tests), a tbf qdisc on both ends holding it to a rate (this kernel has no
// netem: a delay is a relay in the namespace, see delay-relay.ts). Used by the scenarios whose
// servers stand in for a remote registry (`install`, `lazy`).
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { makeNamespaceLink, removeNamespaceLink } from '@dsec/edge';
import type { NamespaceLink } from '@dsec/edge';
import { onCleanup } from './cleanup.js';

const run = promisify(execFile);

/** Names of a link: namespace, host-side interface and the /30's two addresses (`10.<subnet>.<n>.1` the host's, `.2` the namespace's). */
export type ShapedLinkNames = NamespaceLink;

/**
 * Fresh names for a link (nothing is made yet, so that a certificate can name the address first):
 * namespace `dsec-bench-<tag>-<hex>`, host interface `<ifPrefix><hex>`, addresses in `10.<subnet>.<n>.0/30`.
 */
export function shapedLinkNames(tag: string, ifPrefix: string, subnet: number): ShapedLinkNames {
  const hex = randomBytes(3).toString('hex');
  const octet = 1 + (parseInt(hex, 16) % 250);
  return { ns: `dsec-bench-${tag}-${hex}`, hostIf: `${ifPrefix}${hex}`, hostAddress: `10.${subnet}.${octet}.1`, address: `10.${subnet}.${octet}.2` };
}

/** How the link is shaped: tbf `rate`, `burst` and `latency` (tc's units) on both ends. */
export interface ShapedLinkOptions {
  rate: string;
  burst: string;
  latency: string;
  /** A default route in the namespace through the host's end (servers there that reach out). */
  defaultRoute?: boolean;
}

/** Makes the namespace and its link (removed by the bench's cleanup). */
export async function makeShapedLink(link: ShapedLinkNames, opts: ShapedLinkOptions): Promise<void> {
  const { ns, hostIf } = link;
  onCleanup(`network namespace ${ns}`, () => removeNamespaceLink(link));
  await makeNamespaceLink(link, { defaultRoute: opts.defaultRoute === true });
  const tbf = ['root', 'tbf', 'rate', opts.rate, 'burst', opts.burst, 'latency', opts.latency];
  await run('tc', ['qdisc', 'add', 'dev', hostIf, ...tbf]);
  await run('ip', ['netns', 'exec', ns, 'tc', 'qdisc', 'add', 'dev', 'eth0', ...tbf]);
}
