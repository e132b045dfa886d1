// sandbox.network: the sandbox's network policy, addresses, counters and egress log.
import { NetworkLogQuerySchema, NetworkPolicyPatchSchema, NetworkPolicySchema } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import type { SandboxScope } from './scope.js';
import type { EgressLogEntry, NetworkPolicy, NetworkPolicyPatch, SandboxNetworkInfo } from './types.js';
import { defined, validate } from './validate.js';

/**
 * The network of one sandbox. Calling it (`await sandbox.network()`) is the same as
 * `sandbox.network.info()`.
 */
export interface NetworkApi {
  /** The sandbox's network: its policy, addresses, traffic and attempt counters. */
  (opts?: CallOptions): Promise<SandboxNetworkInfo>;
  /** The sandbox's network: its policy, addresses, traffic and attempt counters. */
  info(opts?: CallOptions): Promise<SandboxNetworkInfo>;
  /**
   * Replaces the sandbox's network policy. It applies to new connections when this returns;
   * open connections it no longer allows are closed. On failure the old policy stays in force.
   */
  set(policy: NetworkPolicy, opts?: CallOptions): Promise<SandboxNetworkInfo>;
  /** Changes part of the sandbox's network policy (`{presets: {add: ['pypi']}}`). */
  patch(patch: NetworkPolicyPatch, opts?: CallOptions): Promise<SandboxNetworkInfo>;
  /** The sandbox's latest egress attempts (allowed and denied), oldest first. */
  log(opts?: CallOptions & { limit?: number }): Promise<EgressLogEntry[]>;
}

/** Builds the network module of a sandbox. */
export function networkApi(scope: SandboxScope): NetworkApi {
  const { client } = scope;
  const info = (opts: CallOptions = {}): Promise<SandboxNetworkInfo> => client.json<SandboxNetworkInfo>({ method: 'GET', path: scope.route('/network') }, opts);
  const methods: Pick<NetworkApi, 'info' | 'set' | 'patch' | 'log'> = {
    info,
    set: async (policy, opts = {}) => {
      const body = validate(NetworkPolicySchema, policy, 'network');
      return client.json<SandboxNetworkInfo>({ method: 'PUT', path: scope.route('/network'), body }, opts);
    },
    patch: async (patch, opts = {}) => {
      const body = validate(NetworkPolicyPatchSchema, patch, 'network');
      return client.json<SandboxNetworkInfo>({ method: 'PATCH', path: scope.route('/network'), body }, opts);
    },
    log: async (opts = {}) => {
      const { limit, ...call } = opts;
      const q = validate(NetworkLogQuerySchema, defined({ limit }), 'query');
      return (await client.json<{ items: EgressLogEntry[] }>({ method: 'GET', path: scope.route('/network/log'), query: { limit: q.limit } }, call)).items;
    },
  };
  return Object.assign((opts?: CallOptions) => info(opts), methods);
}
