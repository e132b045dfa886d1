// The policy's verdict on a destination as the proxy asks it: package mirrors first, then IP
// literals, then the sandbox's rules; and the re-check of an open connection when the policy changes.
import { classifyAddress, parseIpAddress } from '@dsec/protocol';
import type { EgressPolicyView, EgressVia } from '../types.js';
import { isIpLiteralLike } from './address.js';
import type { Destination } from './address.js';
import type { EgressReason } from './connections.js';
import type { MirrorAdapter } from './mirror/adapter.js';
import { matchMirror } from './mirror/service.js';
import type { MirrorMatch, MirrorService } from './mirror/service.js';

/** A verdict: allowed by a rule (through a mirror, perhaps), or refused with a reason. */
export type Judgement = { ok: true; rule: string; mirror?: MirrorMatch } | { ok: false; reason: EgressReason; rule?: string; detail?: string };

/** The node's mirrors as judging sees them: the adapters that recognise registries, and the cache (if any). */
export interface MirrorRoutes {
  adapters: readonly MirrorAdapter[];
  mirrors: Pick<MirrorService, 'upstreamAllowed'> | undefined;
}

/** An open connection as re-checked: who, how, where, and the address it reached. */
export interface JudgedConnection {
  sandboxId: string;
  via: EgressVia;
  dest: Destination;
  address?: string;
  mirrored: boolean;
}

/** The policy's verdict on a destination, before any name is resolved. */
export function judge(routes: MirrorRoutes, view: EgressPolicyView, via: EgressVia, dest: Destination): Judgement {
  if (view.mode === 'none') return { ok: false, reason: 'policy', rule: 'mode:none' };
  const mirror = matchMirror(routes.adapters, view.mirrors, dest.host);
  if (mirror) {
    const rule = `mirror:${mirror.preset}`;
    // A mirror answers plain HTTP only: TLS to the public name would reach the real registry
    // past the mirror (and its freeze), so it is refused.
    if (via === 'connect' || via === 'transparent-tls') return { ok: false, reason: 'mirror-requires-http', rule, detail: `use http://${dest.host}/` };
    if (!routes.mirrors?.upstreamAllowed(mirror))
      return { ok: false, reason: 'mirror-not-configured', rule, detail: mirror.mirror.upstream ?? 'no mirror cache on this node' };
    return { ok: true, rule, mirror };
  }
  const literal = parseIpAddress(dest.host);
  if (literal || isIpLiteralLike(dest.host)) {
    // Only an IPv4 literal that a rule names (every spelling arrives here as its dotted quad);
    // IPv6 never (sandboxes have no IPv6 route, and the proxy resolves A records only).
    const d = literal?.family === 4 ? view.allows(dest.host, dest.port) : undefined;
    if (d?.allowed) return { ok: true, rule: d.rule ?? `address:${dest.host}` };
    const what = literal ? `a ${classifyAddress(literal)} IPv${literal.family} address` : 'not an address';
    return { ok: false, reason: 'ip-literal', ...(d?.rule ? { rule: d.rule } : {}), detail: d?.reason ? `${what}: ${d.reason}` : what };
  }
  const d = view.allows(dest.host, dest.port);
  if (!d.allowed) return { ok: false, reason: 'policy', ...(d.rule ? { rule: d.rule } : {}), ...(d.reason ? { detail: d.reason } : {}) };
  return { ok: true, rule: d.rule ?? `host:${dest.host}` };
}

/** Whether an open connection may stay open under the policy its sandbox has now. */
export function recheck(routes: MirrorRoutes, a: JudgedConnection, view: EgressPolicyView | undefined): Judgement {
  if (!view || view.sandboxId !== a.sandboxId) return { ok: false, reason: 'unknown-source' };
  const j = judge(routes, view, a.via === 'mirror' ? 'http' : a.via, a.dest);
  if (!j.ok) return j;
  if (a.mirrored !== (j.mirror !== undefined)) return { ok: false, reason: 'policy', detail: 'mirror route changed' };
  if (a.address && !view.addressAllowed(a.address)) return { ok: false, reason: 'restricted-address', detail: a.address };
  return j;
}
