// A VM's network, shared by every QEMU backend: a namespace per networked VM holding a tap (that
// the VM's uid may open) on a bridge. The node's usual link (eth0, with the sandbox's address)
// joins the bridge once made, and the guest takes over the address, so nftables, the DNS stub and
// the egress proxy apply to a VM exactly as to a container.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';

const run = promisify(execFile);

/** The tap device QEMU opens in the VM's namespace. */
export const VM_TAP = 'tap0';

/** The VM's network namespace name (`ip netns`). */
export function netnsName(id: string): string {
  return `dsec-${id}`;
}

/** A locally administered unicast MAC derived from the sandbox id. */
export function macOf(id: string): string {
  const h = createHash('sha256').update(id).digest();
  return ['02', ...[...h.subarray(0, 5)].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/** Makes the VM's namespace with `tap0` (owned by uid:gid) on bridge `br0`; returns its name. */
export async function createVmNetns(id: string, uid: number, gid: number): Promise<string> {
  const netns = netnsName(id);
  await run('ip', ['netns', 'add', netns]);
  try {
    for (const cmd of [
      ['link', 'set', 'lo', 'up'],
      ['tuntap', 'add', 'dev', VM_TAP, 'mode', 'tap', 'user', String(uid), 'group', String(gid)],
      ['link', 'add', 'br0', 'type', 'bridge'],
      ['link', 'set', VM_TAP, 'master', 'br0'],
      ['link', 'set', VM_TAP, 'up'],
      ['link', 'set', 'br0', 'up'],
    ])
      await run('ip', ['-n', netns, ...cmd]);
  } catch (err) {
    await removeVmNetns(id);
    throw err;
  }
  return netns;
}

/** Removes the VM's namespace (nothing when it has none). */
export async function removeVmNetns(id: string): Promise<void> {
  await run('ip', ['netns', 'del', netnsName(id)]).catch(() => undefined);
}

/**
 * The node made its link (eth0 with the sandbox's address peering the gateway) in the VM's
 * namespace: the address is taken off eth0, which joins the tap's bridge. Returns what the guest
 * must configure on its interface.
 */
export async function bridgeNodeLink(id: string): Promise<{ address: string; gateway: string }> {
  const netns = netnsName(id);
  const { stdout } = await run('ip', ['-n', netns, '-4', '-o', 'addr', 'show', 'dev', 'eth0']);
  const address = /inet (\d+\.\d+\.\d+\.\d+)[ /]/.exec(stdout)?.[1];
  const route = (await run('ip', ['-n', netns, '-4', 'route', 'show', 'default'])).stdout;
  const gateway = /via (\d+\.\d+\.\d+\.\d+)/.exec(route)?.[1];
  if (!address || !gateway) throw new DsecError('BACKEND_FAILED', `sandbox ${id}: the node's link has no address or gateway`, { sandboxId: id });
  for (const cmd of [
    ['addr', 'flush', 'dev', 'eth0'],
    ['link', 'set', 'eth0', 'master', 'br0'],
  ])
    await run('ip', ['-n', netns, ...cmd]);
  return { address, gateway };
}

/** The guest's shell script that takes over the address on its first ethernet interface `dev`. */
export function guestNetScript(dev: string, link: { address: string; gateway: string }, ip = 'ip', mac?: string): string {
  // With `mac`: whatever the guest had (a fork with memory has its source's MAC, address and
  // routes) goes first; down drops its routes and neighbours.
  const reset = mac === undefined ? '' : `${ip} link set ${dev} down && ${ip} addr flush dev ${dev} && ${ip} link set ${dev} address ${mac} && `;
  return `${reset}${ip} link set ${dev} up && ${ip} addr add ${link.address} peer ${link.gateway} dev ${dev} && ${ip} route add default via ${link.gateway} dev ${dev}`;
}
