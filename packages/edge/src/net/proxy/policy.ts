// The shapes the egress proxy needs from the node's network policy: which sandbox a source address
// belongs to, and what that sandbox may reach. The node's policy objects satisfy them; the proxy
// depends on nothing else.

/** A decision of the policy about one destination. */
export interface PolicyDecision {
  allowed: boolean;
  /** The rule that matched (for the log), e.g. `preset:npm` or `domain:*.example.com`. */
  rule?: string;
}

/** A package-mirror route of a policy: requests for a preset's registry are served from `url`. */
export interface MirrorRouteView {
  /** The preset whose registry is mirrored (`npm`); selects the mirror adapter. */
  preset: string;
  /** Base URL the proxy fetches from (http or https), e.g. `http://mirror.internal:4873/`. */
  url: string;
  /** ISO date-time: hide everything published after it (a frozen mirror). */
  cutoff?: string;
}

/** Per-sandbox limits a policy may set (the proxy's defaults apply to what it leaves out). */
export interface PolicyLimits {
  maxConnections?: number;
  bytesPerSecond?: number;
}

/** What the proxy asks of one sandbox's egress policy. */
export interface EgressPolicyView {
  sandboxId: string;
  /** `none`: nothing leaves; `allowlist`: only what `allows` admits. */
  mode: 'none' | 'allowlist';
  /** Whether `host` (a DNS name, lower case; or an IP literal) on `port` may be reached. */
  allows(host: string, port: number): PolicyDecision;
  /** Whether the policy names this address (or a range holding it) explicitly. */
  addressAllowed(ip: string): boolean;
  /** Package-mirror routes. */
  mirrors?: readonly MirrorRouteView[];
  /** Limits that override the proxy's defaults. */
  limits?: PolicyLimits;
}

/** Finds the sandbox (and its current policy) behind a connection's source address. */
export interface SandboxResolver {
  bySourceAddress(ip: string): EgressPolicyView | undefined;
}
