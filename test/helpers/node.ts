// Test fixture: a real edge on a throw-away state directory, torn down even when a test fails.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Edge, mountsUnder, umount, MNT } from '@dsec/edge';
import type { EdgeOptions, NetworkOptions } from '@dsec/edge';
import {
  CallBatchRequestSchema,
  CallRequestSchema,
  DiffOptionsSchema,
  ExecSpecSchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  SandboxClaimSchema,
  SandboxSpecSchema,
  VerifyRequestSchema,
  applyNetworkPatch,
  normalizeNetworkPolicy,
  parseOrThrow,
} from '@dsec/protocol';
import type {
  CallBatchRequest,
  CallRequest,
  DiffOptions,
  ExecSpec,
  NetworkPolicy,
  SandboxClaim,
  SandboxNetwork,
  SandboxSpec,
  VerifyRequest,
} from '@dsec/protocol';

/** Repository root (test/dist/helpers -> ../../..). */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
/** The chronus binary built by the install step. */
export const AGENT_BINARY = path.join(REPO_ROOT, 'chronus/build/chronus');

/** A test node: an edge plus its temp home. */
export interface TestNode {
  edge: Edge;
  home: string;
  cgroupParent: string;
  /** Reopens the edge on the same home (an edge restart); `whileDown` runs while no edge runs. */
  restart(whileDown?: () => Promise<void>): Promise<Edge>;
  /** Destroys every sandbox and removes every mount, cgroup and file. */
  cleanup(): Promise<void>;
}

/** Opens an edge on a fresh temp home with its own cgroup parent; `edge` adds options of its own. */
export async function startNode(opts: { outputCapBytes?: number; network?: NetworkOptions; edge?: Partial<EdgeOptions> } = {}): Promise<TestNode> {
  const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-test-'));
  const cgroupParent = `dsec-test-${path.basename(home).slice(-6)}`;
  const open = (): Promise<Edge> =>
    Edge.open({
      home,
      agentBinary: AGENT_BINARY,
      nodeName: 'test',
      cgroupParent,
      ...(opts.outputCapBytes ? { outputCapBytes: opts.outputCapBytes } : {}),
      ...(opts.network ? { network: opts.network } : {}),
      ...opts.edge,
    });
  const node: TestNode = {
    edge: await open(),
    home,
    cgroupParent,
    async restart(whileDown) {
      await node.edge.close();
      await whileDown?.();
      node.edge = await open();
      return node.edge;
    },
    async cleanup() {
      await node.edge.shutdown().catch(() => undefined);
      for (const m of await mountsUnder(home)) umount(m, MNT.DETACH);
      await rm(home, { recursive: true, force: true });
    },
  };
  return node;
}

/**
 * Input parsed as the API parses it before a node sees it: an edge trusts its types, so tests
 * of refused input parse here (and get the API's INVALID_ARGUMENT naming the field).
 */
export const parsed = {
  sandbox: (input: unknown): SandboxSpec => parseOrThrow(SandboxSpecSchema, input, ''),
  claim: (input: unknown): SandboxClaim => parseOrThrow(SandboxClaimSchema, input, ''),
  exec: (input: unknown): ExecSpec => parseOrThrow(ExecSpecSchema, input, ''),
  network: (input: unknown): NetworkPolicy => normalizeNetworkPolicy(parseOrThrow(NetworkPolicySchema, input, 'network')),
  diff: (input: unknown): DiffOptions => parseOrThrow(DiffOptionsSchema, input, ''),
  verify: (input: unknown): VerifyRequest => parseOrThrow(VerifyRequestSchema, input, ''),
  call: (input: unknown): CallRequest => parseOrThrow(CallRequestSchema, input, ''),
  callBatch: (input: unknown): CallBatchRequest => parseOrThrow(CallBatchRequestSchema, input, ''),
};

/** Patches a sandbox's network policy as the API does: applied to the current policy, the result parsed and set. */
export async function patchNetwork(edge: Edge, id: string, patch: unknown): Promise<SandboxNetwork> {
  const current = (await edge.networkInfo(id)).policy;
  return edge.setNetwork(id, parsed.network(applyNetworkPatch(current, parseOrThrow(NetworkPolicyPatchSchema, patch, 'network'))));
}
