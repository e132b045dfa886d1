// The upstream side of a proxied connection: the proxy resolves the name itself, keeps the
// addresses the sandbox's policy lets it dial, and connects to the first that answers.
import net from 'node:net';
import type { Socket } from 'node:net';
import { connectTcp } from './outbound.js';
import type { EgressPolicyView, NameResolver } from '../types.js';
import type { Destination } from './address.js';

/** What dialling came to: a connected socket, a refusal by policy or resolution, or a failure to connect. */
export type DialResult =
  { socket: Socket; address: string } | { refused: 'unresolvable' | 'restricted-address'; detail: string } | { failed: string; address: string };

/** Resolves `dest`, keeps the addresses the policy lets the proxy dial, connects to the first that answers. */
export async function dialUpstream(
  resolver: NameResolver,
  view: EgressPolicyView,
  dest: Destination,
  timeoutMs: number,
  /** Connects to a checked address (outbound.ts: directly, or through the operator's proxy). */
  connect: (address: string, port: number, timeoutMs: number) => Promise<Socket> = connectTcp,
): Promise<DialResult> {
  let addresses: string[];
  try {
    addresses = net.isIPv4(dest.host) ? [dest.host] : await resolver.resolve4(dest.host, AbortSignal.timeout(timeoutMs));
  } catch (err) {
    return { refused: 'unresolvable', detail: (err as Error).message };
  }
  if (addresses.length === 0) return { refused: 'unresolvable', detail: `${dest.host} has no address` };
  // The addresses checked here are the ones dialled: no second lookup, no rebinding window.
  const usable = addresses.filter((a) => net.isIPv4(a) && view.addressAllowed(a));
  if (usable.length === 0) return { refused: 'restricted-address', detail: `${dest.host} resolves to ${addresses.slice(0, 8).join(', ')}` };
  let failure = '';
  for (const address of usable.slice(0, 8)) {
    try {
      return { socket: await connect(address, dest.port, timeoutMs), address };
    } catch (err) {
      failure = (err as Error).message;
    }
  }
  return { failed: failure, address: usable[0]! };
}
