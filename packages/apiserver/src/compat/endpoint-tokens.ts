// Endpoint tokens: admin-made, revocable secrets that stand in a URL's path, for clients that
// send no headers (verl's SandboxFusion client posts to a bare URL). A token acts in one project
// with the member role, only under its protocol's prefix (`/v1/sandboxfusion/t/<token>/...`).
// Only its SHA-256 is stored; the audit records the route pattern (`:token`), never the path,
// and the token's id stands for it as the audit's key id.
import { createHash, randomBytes } from 'node:crypto';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import { DsecError } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { AuthRequest, Authenticator, Principal } from '../auth.js';
import type { StateStore } from '../db/store.js';
import { router } from '../http/env.js';
import type { RouterDeps } from '../http/env.js';
import { jsonBody } from '../http/validate.js';

/** Prefix of every endpoint token secret. */
export const ENDPOINT_TOKEN_PREFIX = 'dsec_ept_';
/** Protocols an endpoint token may serve, and the path prefix it is read from. */
export const ENDPOINT_TOKEN_PROTOCOLS = { sandboxfusion: '/v1/sandboxfusion/t/' } as const;
/** How long a looked-up token is trusted before the store is asked again (a revoke elsewhere takes this long). */
const CACHE_TTL_MS = 5_000;

/** POST /v1/endpoint-tokens */
export const CreateEndpointTokenRequestSchema = z.strictObject({
  name: z.string().min(1).max(128),
  /** Project the token acts in (default the caller's). */
  project: z.string().min(1).max(128).optional(),
  protocol: z.enum(Object.keys(ENDPOINT_TOKEN_PROTOCOLS) as ['sandboxfusion']).default('sandboxfusion'),
});

export type CreateEndpointTokenRequest = z.infer<typeof CreateEndpointTokenRequestSchema>;

/** An endpoint token as the API shows it (`token` and `path` only in the reply that made it). */
export interface EndpointToken {
  id: string;
  name: string;
  project: string;
  protocol: keyof typeof ENDPOINT_TOKEN_PROTOCOLS;
  createdBy: string;
  createdAt: string;
  revokedAt: string | null;
  token?: string;
  /** The URL path prefix clients are given (`/v1/sandboxfusion/t/<token>`). */
  path?: string;
}

interface EndpointTokenRow {
  id: string;
  name: string;
  project_id: string;
  protocol: string;
  token_hash: string;
  created_by: string;
  created_at: string;
  revoked_at: string | null;
}

interface Tables {
  endpoint_tokens: EndpointTokenRow;
}

function hashToken(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

function toToken(r: EndpointTokenRow): EndpointToken {
  return {
    id: r.id,
    name: r.name,
    project: r.project_id,
    protocol: r.protocol as EndpointToken['protocol'],
    createdBy: r.created_by,
    createdAt: r.created_at,
    revokedAt: r.revoked_at,
  };
}

/** The token in a path under one of the protocols' prefixes, or undefined. */
export function tokenInPath(path: string): { protocol: EndpointToken['protocol']; token: string } | undefined {
  for (const [protocol, prefix] of Object.entries(ENDPOINT_TOKEN_PROTOCOLS)) {
    if (!path.startsWith(prefix)) continue;
    const token = path.slice(prefix.length).split('/')[0] ?? '';
    return { protocol: protocol as EndpointToken['protocol'], token };
  }
  return undefined;
}

/** Endpoint tokens: made, listed and revoked by admins; resolved to principals by the authenticator's hook. */
export class EndpointTokenService {
  private readonly cache = new Map<string, { principal: Principal; at: number }>();

  constructor(
    private readonly store: StateStore,
    private readonly auth: Authenticator,
  ) {
    auth.addCredentialHook((req) => this.hook(req));
  }

  private get db(): Kysely<Tables> {
    return this.store.db as unknown as Kysely<Tables>;
  }

  /** Makes a token for a visible project (admin); the secret is in this reply only. */
  async create(p: Principal, req: CreateEndpointTokenRequest): Promise<EndpointToken> {
    requireRole(p, 'admin');
    const project = req.project ?? p.projectId;
    if (!p.visibleProjects.has(project)) throw new DsecError('NOT_FOUND', `project ${project} not found`, { field: 'project' });
    const secret = ENDPOINT_TOKEN_PREFIX + randomBytes(24).toString('base64url');
    const row: EndpointTokenRow = {
      id: `ept-${randomBytes(8).toString('hex')}`,
      name: req.name,
      project_id: project,
      protocol: req.protocol,
      token_hash: hashToken(secret),
      created_by: p.keyId,
      created_at: new Date().toISOString(),
      revoked_at: null,
    };
    await this.db.insertInto('endpoint_tokens').values(row).execute();
    return { ...toToken(row), token: secret, path: `${ENDPOINT_TOKEN_PROTOCOLS[req.protocol]}${secret}` };
  }

  /** The tokens of the visible projects (no secrets). */
  async list(p: Principal): Promise<EndpointToken[]> {
    requireRole(p, 'admin');
    const projects = [...p.visibleProjects];
    const rows = await this.db.selectFrom('endpoint_tokens').selectAll().where('project_id', 'in', projects).orderBy('created_at').execute();
    return rows.map(toToken);
  }

  /** Revokes a token of a visible project: it stops working at once here, within 5 s on other replicas. */
  async revoke(p: Principal, id: string): Promise<void> {
    requireRole(p, 'admin');
    const row = await this.db.selectFrom('endpoint_tokens').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('NOT_FOUND', `endpoint token ${id} not found`, { field: 'id' });
    await this.db.updateTable('endpoint_tokens').set({ revoked_at: new Date().toISOString() }).where('id', '=', id).where('revoked_at', 'is', null).execute();
    this.cache.clear();
  }

  /** The principal of a request whose path carries a token (UNAUTHENTICATED for an unknown or revoked one). */
  private hook(req: AuthRequest): Promise<Principal> | undefined {
    const found = tokenInPath(req.path);
    return found ? this.principalOf(found.protocol, found.token) : undefined;
  }

  private async principalOf(protocol: string, token: string): Promise<Principal> {
    const hash = hashToken(token);
    const hit = this.cache.get(hash);
    if (hit && Date.now() - hit.at < CACHE_TTL_MS) return hit.principal;
    const row = await this.db.selectFrom('endpoint_tokens').selectAll().where('token_hash', '=', hash).executeTakeFirst();
    if (!row || row.revoked_at || row.protocol !== protocol) throw new DsecError('UNAUTHENTICATED', 'unknown or revoked endpoint token');
    const principal: Principal = {
      keyId: row.id,
      projectId: row.project_id,
      role: 'member',
      visibleProjects: await this.auth.descendants(row.project_id),
      tenantId: await this.auth.tenantOf(row.project_id),
    };
    this.cache.set(hash, { principal, at: Date.now() });
    return principal;
  }
}

/** /v1/endpoint-tokens: make (admin), list, revoke. */
export function endpointTokenRoutes({ services: { endpointTokens } }: RouterDeps) {
  return router()
    .post('/endpoint-tokens', jsonBody(CreateEndpointTokenRequestSchema), async (c) =>
      c.json(await endpointTokens.create(c.get('principal'), c.get('body')), 201),
    )
    .get('/endpoint-tokens', async (c) => c.json({ items: await endpointTokens.list(c.get('principal')), nextCursor: null }))
    .delete('/endpoint-tokens/:id', async (c) => {
      await endpointTokens.revoke(c.get('principal'), c.req.param('id'));
      return c.body(null, 204);
    });
}
