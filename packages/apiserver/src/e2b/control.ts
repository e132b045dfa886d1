// E2B's control plane (E2B's spec/openapi.yml as the e2b SDKs 2.45 and 2.51 call it), over the
// dsec services: create (/sandboxes and /v2/sandboxes), list (/v2/sandboxes, /sandboxes), get,
// kill, timeout, connect (resumes), pause, resume, snapshots, fork and metrics.
import { z } from 'zod';
import { DsecError, MAX_SANDBOX_TIMEOUT_MS, invalidArgument, parseOrThrow } from '@dsec/protocol';
import type { CreateSandboxRequest, NetworkPolicy, Sandbox } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import type { Services } from '../services/index.js';
import { E2bError } from './errors.js';
import {
  HTTPS_PORTS_LABEL,
  MASK_HOST_LABEL,
  METADATA_PREFIX,
  NO_TOKEN,
  TEMPLATE_LABEL,
  TOKEN_LABEL,
  TRAFFIC_TOKEN_LABEL,
  listedSandbox,
  newAccessToken,
  sandboxReply,
  tokenFor,
} from './sandboxes.js';
import type { TemplateResolver } from './templates.js';
import { ENVD_PORT } from './ports.js';

/** E2B's default sandbox timeout when a request names none (its API's default), seconds. */
export const DEFAULT_TIMEOUT_S = 15;
const MAX_TIMEOUT_S = MAX_SANDBOX_TIMEOUT_MS / 1000;
/** Metadata entries of a sandbox (dsec's 64 labels less the E2B API's own: template, tokens, port settings). */
const MAX_METADATA_ENTRIES = 58;
/** A host mask: a host name with an optional port, `${PORT}` standing for the port asked for. */
const MASK_HOST = /^[A-Za-z0-9._-]+(:[0-9]{1,5})?$/;

/** The labels of `network.maskRequestHost` and `network.httpsPorts` (ports.ts reads them). */
function portLabels(n: { maskRequestHost?: string | undefined; httpsPorts?: number[] | undefined } | null | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (n?.maskRequestHost !== undefined) {
    if (!MASK_HOST.test(n.maskRequestHost.replaceAll('${PORT}', '1')))
      throw invalidArgument('network.maskRequestHost', 'must be a host name with an optional :port, where ${PORT} stands for the port');
    out[MASK_HOST_LABEL] = n.maskRequestHost;
  }
  if (n?.httpsPorts && n.httpsPorts.length > 0) {
    if (n.httpsPorts.includes(ENVD_PORT)) throw invalidArgument('network.httpsPorts', `envd's port ${ENVD_PORT} cannot be listed`);
    out[HTTPS_PORTS_LABEL] = [...new Set(n.httpsPorts)].join(',');
  }
  return out;
}

/** Metadata keys that fit in a dsec label key after the `e2b/` prefix. */
const METADATA_KEY = /^[A-Za-z0-9][A-Za-z0-9._-]{0,58}$/;

/** Ports of `network.httpsPorts` (their list must fit one label). */
const MAX_HTTPS_PORTS = 32;

const TimeoutSchema = z.number().int().min(1).max(MAX_TIMEOUT_S);

/** `NewSandbox` (fields the SDKs send; unknown ones are ignored as E2B's API does). */
export const NewSandboxSchema = z.object({
  templateID: z.string().min(1).max(256),
  timeout: TimeoutSchema.optional(),
  metadata: z.record(z.string(), z.string().max(256)).optional(),
  envVars: z.record(z.string(), z.string()).optional(),
  secure: z.boolean().optional(),
  allow_internet_access: z.boolean().optional(),
  network: z
    .object({
      allowOut: z.array(z.string().max(255)).max(256).optional(),
      denyOut: z.array(z.string().max(255)).max(256).optional(),
      allowPublicTraffic: z.boolean().optional(),
      maskRequestHost: z.string().max(255).optional(),
      httpsPorts: z.array(z.number().int().min(1).max(65535)).max(MAX_HTTPS_PORTS).optional(),
      rules: z.unknown().optional(),
      egressProxy: z.unknown().optional(),
    })
    .nullable()
    .optional(),
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  autoResume: z.object({ enabled: z.boolean() }).nullable().optional(),
  mcp: z.unknown().optional(),
  iam: z.unknown().optional(),
  volumeMounts: z.array(z.unknown()).optional(),
});
export type NewSandbox = z.infer<typeof NewSandboxSchema>;

const TimeoutBodySchema = z.object({ timeout: TimeoutSchema });
const ConnectBodySchema = z.object({ timeout: TimeoutSchema.optional(), memory: z.boolean().optional() });
const PauseBodySchema = z.object({ memory: z.boolean().optional() });
const SnapshotBodySchema = z.object({ name: z.string().min(1).max(200).optional() });
const ForkBodySchema = z.object({ timeout: TimeoutSchema.optional(), count: z.number().int().min(1).max(64).optional() });

/** `SandboxNetworkUpdateConfig` (PUT /sandboxes/{id}/network): replaces the egress rules. */
const NetworkUpdateSchema = z.object({
  allowOut: z.array(z.string().max(255)).max(256).optional(),
  denyOut: z.array(z.string().max(255)).max(256).optional(),
  allow_internet_access: z.boolean().optional(),
  rules: z.unknown().optional(),
  egressProxy: z.unknown().optional(),
});

const ANY_ADDRESS = '0.0.0.0/0';

/** Refuses the E2B network fields dsec has no counterpart for (header rewriting rules, a customer egress proxy). */
function refuseUnsupportedNetwork(n: { rules?: unknown; egressProxy?: unknown } | null | undefined, at: string): void {
  const rules = n?.rules;
  if (rules !== undefined && rules !== null && !(typeof rules === 'object' && Object.keys(rules).length === 0))
    throw invalidArgument(`${at}rules`, 'per-host request transforms are not supported by dsec');
  if (n?.egressProxy !== undefined && n.egressProxy !== null) throw invalidArgument(`${at}egressProxy`, 'a customer egress proxy is not supported by dsec');
}

/**
 * E2B's network fields as a dsec egress policy. dsec is closed by default and has no "open"
 * mode: `allowOut` host names (exact, `*.suffix` or IPv4) become allow rules through the egress
 * proxy, `denyOut` names its deny list; `0.0.0.0/0` in `denyOut` is what closed means anyway;
 * `allow_internet_access` alone opens nothing (docs/e2b.md, "Network").
 */
export function networkPolicy(body: Pick<NewSandbox, 'network' | 'allow_internet_access'>): NetworkPolicy {
  const allow = (body.network?.allowOut ?? []).filter((h) => h !== ANY_ADDRESS);
  const deny = (body.network?.denyOut ?? []).filter((h) => h !== ANY_ADDRESS);
  if ((body.network?.allowOut ?? []).includes(ANY_ADDRESS))
    throw invalidArgument('network.allowOut', 'dsec has no open egress: name the hosts to allow (exact names, *.suffix or IPv4 addresses)');
  if (body.allow_internet_access === false && allow.length > 0) throw invalidArgument('network.allowOut', 'allow_internet_access is false');
  if (allow.length === 0) return { mode: 'none' };
  return { mode: 'allowlist', allow: allow.map((host) => ({ host })), ...(deny.length > 0 ? { deny } : {}) };
}

/** Largest control-plane JSON body. */
export const MAX_E2B_BODY_BYTES = 4 * 1024 * 1024;

/** The body as text, refused (413) once it passes `limit` bytes: never buffered past the limit, chunked or not. */
async function boundedText(req: Request, limit: number): Promise<string> {
  const tooLarge = () => new DsecError('PAYLOAD_TOO_LARGE', `body larger than ${limit} bytes`);
  const declared = req.headers.get('content-length');
  if (declared !== null && Number(declared) > limit) throw tooLarge();
  if (!req.body) return '';
  const chunks: Uint8Array[] = [];
  let size = 0;
  // Leaving the loop early (the throw) cancels the stream: nothing past the limit is buffered.
  for await (const value of req.body as unknown as AsyncIterable<Uint8Array>) {
    size += value.byteLength;
    if (size > limit) throw tooLarge();
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** Parses a JSON body (empty: `{}`) with an E2B schema; 400 naming the field. */
export async function e2bBody<S extends z.ZodType>(req: Request, schema: S): Promise<z.infer<S>> {
  const text = await boundedText(req, MAX_E2B_BODY_BYTES);
  let raw: unknown = {};
  if (text.trim() !== '') {
    try {
      raw = JSON.parse(text);
    } catch {
      throw invalidArgument('body', 'not JSON');
    }
  }
  return parseOrThrow(schema, raw, '');
}

/** What the control plane is built from. */
export interface ControlDeps {
  services: Services;
  templates: TemplateResolver;
  /** The `domain` returned to clients (host-name routing), or null. */
  domain: string | null;
}

/** The control plane's operations (routes in index.ts). */
export class E2bControl {
  constructor(private readonly d: ControlDeps) {}

  /** POST /sandboxes, /v2/sandboxes */
  async create(p: Principal, body: NewSandbox, signal?: AbortSignal): Promise<Record<string, unknown>> {
    if (body.mcp !== undefined && body.mcp !== null) throw invalidArgument('mcp', 'MCP gateways are not supported by dsec');
    if (body.volumeMounts && body.volumeMounts.length > 0) throw invalidArgument('volumeMounts', 'volumes are not supported by dsec');
    if (body.iam !== undefined && body.iam !== null) throw invalidArgument('iam', 'IAM tokens are not supported by dsec');
    refuseUnsupportedNetwork(body.network, 'network.');
    const labels: Record<string, string> = portLabels(body.network);
    for (const [k, v] of Object.entries(body.metadata ?? {})) {
      if (!METADATA_KEY.test(k)) throw invalidArgument(`metadata.${k}`, 'keys are letters, digits, ".", "_" and "-" (at most 59)');
      labels[METADATA_PREFIX + k] = v;
    }
    if (Object.keys(body.metadata ?? {}).length > MAX_METADATA_ENTRIES) throw invalidArgument('metadata', `at most ${MAX_METADATA_ENTRIES} entries`);
    labels[TEMPLATE_LABEL] = body.templateID;
    const token = body.secure === false ? NO_TOKEN : newAccessToken();
    labels[TOKEN_LABEL] = token;
    // Ports are public (E2B's default) unless the request closes them: then they need this token.
    const traffic = body.network?.allowPublicTraffic === false ? newAccessToken() : undefined;
    if (traffic) labels[TRAFFIC_TOKEN_LABEL] = traffic;
    const from = await this.d.templates.resolve(p, body.templateID);
    const req: CreateSandboxRequest = {
      ...from,
      labels,
      ...(body.envVars ? { env: body.envVars } : {}),
      network: networkPolicy(body),
      timeoutMs: (body.timeout ?? DEFAULT_TIMEOUT_S) * 1000,
      // E2B sandboxes live until their timeout: no idle pause; traffic resumes a paused one only
      // when the request asks (autoResume.enabled), else the data plane answers 502 as E2B's does.
      // `autoPause` (the SDK's `lifecycle.onTimeout: 'pause'`) pauses at the end instead of killing.
      lease: { idleTimeoutMs: 0, autoResume: body.autoResume?.enabled === true, onExpire: body.autoPause === true ? 'pause' : 'kill' },
    };
    const s = await this.d.services.sandboxes.create(p, req, { signal });
    return sandboxReply(s, this.d.domain, tokenFor(p, token), tokenFor(p, traffic));
  }

  /** GET /sandboxes/{id} */
  async get(p: Principal, id: string): Promise<Record<string, unknown>> {
    const s = await this.d.services.sandboxes.get(p, id);
    return listedSandbox(s, true, this.d.domain, tokenFor(p, await this.tokenOf(id)), (await this.tokenOf(id, TRAFFIC_TOKEN_LABEL)) !== undefined);
  }

  /** A sandbox's access token (kept out of its visible labels); read after the caller's access was checked. */
  private async tokenOf(id: string, label = TOKEN_LABEL): Promise<string | undefined> {
    return (await this.d.services.lifecycle.rowById(id))?.labels[label];
  }

  /** The create/connect reply of a sandbox, with the tokens the caller may read. */
  private async replyOf(p: Principal, id: string): Promise<Record<string, unknown>> {
    const s = await this.d.services.sandboxes.get(p, id);
    return sandboxReply(s, this.d.domain, tokenFor(p, await this.tokenOf(id)), tokenFor(p, await this.tokenOf(id, TRAFFIC_TOKEN_LABEL)));
  }

  /**
   * GET /v2/sandboxes (and the older GET /sandboxes, running only): metadata and state filters,
   * `startedAfter`, `template`, `order` (default newest first), `limit` and `nextToken`.
   */
  async list(p: Principal, q: URLSearchParams, legacy: boolean): Promise<{ items: Record<string, unknown>[]; nextToken: string | null }> {
    const wanted = new Map<string, string>();
    const meta = q.get('metadata');
    if (meta) {
      for (const [k, v] of new URLSearchParams(meta)) wanted.set(decodeURIComponent(k), decodeURIComponent(v));
    }
    const states = legacy ? ['running'] : (q.get('state') ?? 'running,paused').split(',').filter((s) => s !== '');
    for (const s of states) if (s !== 'running' && s !== 'paused') throw invalidArgument('state', `unknown state ${s}`);
    const order = q.get('order') ?? 'desc';
    if (order !== 'asc' && order !== 'desc') throw invalidArgument('order', 'asc or desc');
    const after = q.get('startedAfter');
    const afterMs = after ? Date.parse(after) : undefined;
    if (afterMs !== undefined && Number.isNaN(afterMs)) throw invalidArgument('startedAfter', 'not an RFC 3339 time');
    const limit = q.get('limit') === null ? 100 : Number(q.get('limit'));
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw invalidArgument('limit', '1 to 100');
    const template = q.get('template');
    const token = q.get('nextToken');
    const labels = [...wanted].map(([k, v]) => `${METADATA_PREFIX}${k}=${v}`);
    const all: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.d.services.sandboxes.list(p, { label: labels, limit: 1000, ...(cursor ? { cursor } : {}) });
      all.push(...page.items);
      cursor = page.nextCursor ?? undefined;
    } while (cursor && all.length < 100_000);
    const rows = all
      .filter((s) => states.includes(s.state === 'paused' ? 'paused' : s.state === 'running' ? 'running' : 'other'))
      .filter((s) => afterMs === undefined || Date.parse(s.createdAt) >= afterMs)
      .filter((s) => !template || (s.labels[TEMPLATE_LABEL] ?? s.image.base) === template)
      .sort((a, b) => (order === 'asc' ? 1 : -1) * (a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id)));
    let start = 0;
    if (token) {
      const last = Buffer.from(token, 'base64url').toString('utf8');
      const i = rows.findIndex((s) => s.id === last);
      if (!/^[a-z0-9-]{1,128}$/.test(last)) throw invalidArgument('nextToken', 'not a token from this API');
      start = i + 1;
    }
    const page = rows.slice(start, start + limit);
    const more = start + limit < rows.length;
    return {
      items: page.map((s) => listedSandbox(s, false, this.d.domain)),
      nextToken: more && page.length > 0 ? Buffer.from(page[page.length - 1]!.id).toString('base64url') : null,
    };
  }

  /** DELETE /sandboxes/{id} */
  async kill(p: Principal, id: string): Promise<void> {
    await this.d.services.lifecycle.destroy(p, id);
  }

  /** Sets the sandbox's end to now + `seconds` (`extendOnly`: never earlier than it is). */
  private async setEnd(p: Principal, s: Sandbox, seconds: number, extendOnly: boolean): Promise<void> {
    const end = Date.now() + seconds * 1000;
    if (extendOnly && end <= Date.parse(s.expiresAt)) return;
    const lifetime = Math.min(MAX_SANDBOX_TIMEOUT_MS, Math.max(1000, end - Date.parse(s.createdAt)));
    await this.d.services.sandboxes.update(p, s.id, { lease: { maxLifetimeMs: lifetime } });
  }

  /** POST /sandboxes/{id}/timeout */
  async timeout(p: Principal, id: string, seconds: number): Promise<void> {
    await this.setEnd(p, await this.d.services.sandboxes.get(p, id), seconds, false);
  }

  /** POST /sandboxes/{id}/connect (and /v2/...): resumes a paused sandbox; 201 when it did. */
  async connect(p: Principal, id: string, seconds: number | undefined): Promise<{ status: 200 | 201; body: Record<string, unknown> }> {
    let s = await this.d.services.sandboxes.get(p, id);
    let status: 200 | 201 = 200;
    if (s.state === 'paused') {
      s = (await this.d.services.lifecycle.resume(p, id, {})).sandbox;
      status = 201;
    }
    if (seconds !== undefined) await this.setEnd(p, s, seconds, true);
    return { status, body: await this.replyOf(p, id) };
  }

  /** PUT /sandboxes/{id}/network: replaces the egress rules, validated as a create's are. */
  async updateNetwork(p: Principal, id: string, body: z.infer<typeof NetworkUpdateSchema>): Promise<void> {
    refuseUnsupportedNetwork(body, '');
    const policy = networkPolicy({
      network: { ...(body.allowOut ? { allowOut: body.allowOut } : {}), ...(body.denyOut ? { denyOut: body.denyOut } : {}) },
      ...(body.allow_internet_access !== undefined ? { allow_internet_access: body.allow_internet_access } : {}),
    });
    await this.d.services.networks.change(p, id, { replace: policy });
  }

  /** POST /sandboxes/{id}/pause: 409 when already paused. */
  async pause(p: Principal, id: string): Promise<void> {
    const s = await this.d.services.sandboxes.get(p, id);
    if (s.state === 'paused') throw new E2bError(409, `sandbox ${id} is already paused`);
    await this.d.services.lifecycle.pause(p, id);
  }

  /** POST /sandboxes/{id}/snapshots: a snapshot layer, usable as `templateID`. */
  async snapshot(p: Principal, id: string, name: string | undefined, signal?: AbortSignal): Promise<Record<string, unknown>> {
    const layer = await this.d.services.snapshots.snapshot(p, id, name === undefined ? {} : { name }, signal);
    return { snapshotID: layer.digest.replace(/^sha256:/, ''), names: layer.names };
  }

  /** GET /snapshots */
  async snapshots(p: Principal, q: URLSearchParams): Promise<{ items: Record<string, unknown>[]; nextToken: string | null }> {
    const sandboxId = q.get('sandboxID');
    const name = q.get('name');
    const limit = q.get('limit') === null ? 100 : Number(q.get('limit'));
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw invalidArgument('limit', '1 to 100');
    const rows = (await this.d.services.layers.list(p, 'snapshot'))
      .filter((l) => !sandboxId || l.snapshot?.sandboxId === sandboxId)
      .filter((l) => !name || l.names.some((n) => n === name || n.startsWith(`${name}:`)))
      .sort((a, b) => a.digest.localeCompare(b.digest));
    const token = q.get('nextToken');
    const start = token ? rows.findIndex((l) => l.digest === Buffer.from(token, 'base64url').toString('utf8')) + 1 : 0;
    const page = rows.slice(start, start + limit);
    return {
      items: page.map((l) => ({ snapshotID: l.digest.replace(/^sha256:/, ''), names: l.names })),
      nextToken: start + limit < rows.length && page.length > 0 ? Buffer.from(page[page.length - 1]!.digest).toString('base64url') : null,
    };
  }

  /** DELETE /templates/{id}: a snapshot (or another layer of the project). */
  async deleteTemplate(p: Principal, id: string): Promise<void> {
    await this.d.services.layers.remove(p, id);
  }

  /** POST /sandboxes/{id}/fork: `count` copies from one snapshot; each entry a sandbox. */
  async fork(p: Principal, id: string, body: z.infer<typeof ForkBodySchema>, signal?: AbortSignal): Promise<Record<string, unknown>[]> {
    const token = newAccessToken();
    const r = await this.d.services.snapshots.fork(
      p,
      id,
      { count: body.count ?? 1, labels: { [TOKEN_LABEL]: token }, timeoutMs: (body.timeout ?? DEFAULT_TIMEOUT_S) * 1000 },
      signal,
    );
    return r.sandboxes.map((s) => ({ sandbox: sandboxReply(s, this.d.domain, tokenFor(p, token)) }));
  }

  /** GET /sandboxes/{id}/metrics: one sample, taken now (dsec measures on demand). */
  async metrics(p: Principal, id: string): Promise<Record<string, unknown>[]> {
    const s = await this.d.services.sandboxes.get(p, id);
    const st = await this.d.services.sandboxes.stats(p, id);
    const now = Date.now();
    const upMs = Math.max(1, now - Date.parse(s.createdAt));
    const cpus = Math.max(1, Math.ceil(s.resources.cpu));
    return [
      {
        timestamp: new Date(now).toISOString(),
        timestampUnix: Math.floor(now / 1000),
        cpuCount: cpus,
        cpuUsedPct: Math.min(100, (st.cpuUsageMs / upMs / cpus) * 100),
        memUsed: st.memoryBytes,
        memTotal: st.memoryLimitBytes,
        memCache: 0,
        diskUsed: st.diskUsedBytes,
        diskTotal: st.diskLimitBytes,
      },
    ];
  }
}

export { ConnectBodySchema, ForkBodySchema, NetworkUpdateSchema, PauseBodySchema, SnapshotBodySchema, TimeoutBodySchema };
