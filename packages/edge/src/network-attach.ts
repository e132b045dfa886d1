// Putting a sandbox on the node's network: its link in the backend's network namespace, its
// resolver pointed at the gateway's DNS stub.
import { invalidArgument } from '@dsec/protocol';
import type { NetworkPolicy } from '@dsec/protocol';
import type { Backend, SandboxAgent } from './backend.js';
import { installTrust } from './net/trust.js';
import type { NodeNetwork } from './net/network.js';

/** The sandbox's network namespace; INVALID_ARGUMENT for a backend without networking. */
export function netnsOf(backend: Backend, id: string): Promise<string> {
  if (!backend.network) throw invalidArgument('network.mode', `the ${backend.kind} backend has no network; use mode none`);
  return backend.network.netnsPath(id);
}

/**
 * Points a networked sandbox's resolver at the gateway's DNS stub and adds the operator's CA
 * certificates to its trust (nothing for one without a link).
 */
export async function writeResolvConf(network: NodeNetwork, backend: Backend, id: string): Promise<void> {
  if (network.resolvConf(id) === undefined) return; // no link: nothing to write, no agent to reach
  await writeNetworkFiles(network, await backend.agent(id), id);
}

/** Writes what a linked sandbox's root needs for the network: resolv.conf, the operator's CAs, package-manager settings. */
export async function writeNetworkFiles(network: NodeNetwork, agent: SandboxAgent, id: string): Promise<void> {
  const conf = network.resolvConf(id);
  if (!conf) return;
  await agent.writeFile('/etc/resolv.conf', conf, { mode: 0o644 });
  const cas = network.operatorCas(id);
  if (cas) await installTrust(agent, cas);
  // An image without the package manager (no /etc/apt) has nothing to configure.
  for (const f of network.presetFiles(id)) await agent.writeFile(f.path, f.content, { mode: 0o644 }).catch(() => undefined);
}

/** Puts a new sandbox on the network; a failure destroys it (no half-created sandbox). */
export async function joinNetwork(network: NodeNetwork, backend: Backend, id: string, policy: NetworkPolicy): Promise<void> {
  try {
    await network.apply(id, policy, () => netnsOf(backend, id));
    await backend.network?.linked?.(id);
    await writeResolvConf(network, backend, id);
  } catch (err) {
    await backend.destroy(id).catch(() => undefined);
    await network.remove(id).catch(() => undefined);
    throw err;
  }
}
