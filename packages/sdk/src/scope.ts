// What the modules of one Sandbox share: its client, its id and routes, and the means to
// remember the sandbox's latest description and to hand back Sandbox objects for new ones.
import type { DsecClient } from './client.js';
import type { Sandbox } from './sandbox.js';
import type { SandboxInfo } from './types.js';

/** The part of a Sandbox its modules (`commands`, `files`, `network`, ...) work through. */
export interface SandboxScope {
  readonly client: DsecClient;
  /** Sandbox id (`<node>-<hex>`). */
  readonly id: string;
  /** `/v1/sandboxes/{id}` followed by `suffix`. */
  route(suffix?: string): string;
  /** Keeps `info` as the sandbox's latest description (`sandbox.lastInfo`). */
  remember(info: SandboxInfo): void;
  /** A Sandbox object, on the same client, for a sandbox the API just described (a fork's, a replay's). */
  adopt(info: SandboxInfo): Sandbox;
}

/** The API route of a sandbox, followed by `suffix`. */
export function sandboxRoute(id: string, suffix = ''): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
}
