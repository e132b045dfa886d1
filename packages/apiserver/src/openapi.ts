// The OpenAPI 3.1 document, generated from the protocol's zod schemas.
import { z } from 'zod';
import * as api from '@dsec/protocol';
import { COMPAT_ROUTES, COMPAT_SECURITY_SCHEMES } from './compat/openapi-routes.js';

type Schema = z.ZodType;
/** One route of the document. */
export interface Route {
  method: 'get' | 'post' | 'put' | 'patch' | 'delete';
  path: string;
  summary: string;
  body?: Schema | 'binary';
  query?: Schema;
  reply?: Schema | 'binary' | 'ndjson' | 'png';
  status?: number;
  /** Optional request headers the route reads. */
  headers?: string[];
  /** How the route authenticates (default the bearer key; see `components.securitySchemes`). */
  security?: Array<Record<string, string[]>>;
  /** A multipart form instead of a JSON body. */
  form?: Record<string, { type: string; format?: string }>;
}

const page = (item: Schema): Schema => api.pageOf(item);

const ROUTES: Route[] = [
  {
    method: 'post',
    path: '/v1/sandboxes',
    summary: 'Create a sandbox (claimed from a warm pool when one matches)',
    body: api.CreateSandboxRequestSchema,
    reply: api.SandboxSchema,
    status: 201,
    headers: [api.IDEMPOTENCY_KEY_HEADER],
  },
  {
    method: 'post',
    path: '/v1/sandboxes:batch',
    summary: 'Create up to 10,000 sandboxes, one result per item (ndjson progress with Accept: application/x-ndjson)',
    body: api.CreateSandboxBatchRequestSchema,
    reply: api.CreateSandboxBatchResultSchema,
    headers: [api.IDEMPOTENCY_KEY_HEADER],
  },
  { method: 'get', path: '/v1/sandboxes', summary: 'List sandboxes', query: api.ListSandboxesQuerySchema, reply: page(api.SandboxSchema) },
  { method: 'get', path: '/v1/sandboxes/{id}', summary: 'Get a sandbox', reply: api.SandboxSchema },
  {
    method: 'delete',
    path: '/v1/sandboxes/{id}',
    summary: 'Destroy a sandbox (`Prefer: respond-async`: 202 once the delete is durable, the teardown behind it)',
    status: 204,
    headers: ['prefer'],
  },
  {
    method: 'patch',
    path: '/v1/sandboxes/{id}',
    summary: 'Change the lease or the owner of a sandbox',
    body: api.UpdateSandboxRequestSchema,
    reply: api.SandboxSchema,
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/pause',
    summary: 'Pause a sandbox (freeze it, reclaim its memory, or with memory "file" write it to a file)',
    body: api.PauseRequestSchema,
    reply: api.PauseResultSchema,
  },
  { method: 'post', path: '/v1/sandboxes/{id}/resume', summary: 'Resume a paused sandbox', body: api.ResumeRequestSchema, reply: api.PauseResultSchema },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/stats',
    summary: 'Resource use of a sandbox (with Accept: application/x-ndjson a stream of samples every intervalMs)',
  },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/screen',
    summary: 'Screenshot of a VM (image/png; X-Screen-Width and X-Screen-Height give its size)',
    reply: 'png',
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/input',
    summary: 'Mouse and keyboard actions on a VM, in screen pixels (computer-use vocabulary)',
    body: api.ScreenInputRequestSchema,
    reply: api.ScreenInputResultSchema,
  },
  { method: 'get', path: '/v1/sandboxes/{id}/vnc', summary: 'Live view of a VM: its VNC server (RFB 3.8) over WebSocket, binary messages' },
  { method: 'post', path: '/v1/owners', summary: 'Open an owner session', body: api.CreateOwnerRequestSchema, reply: api.OwnerSchema, status: 201 },
  { method: 'get', path: '/v1/owners/{id}', summary: 'Get an owner session', reply: api.OwnerSchema },
  { method: 'post', path: '/v1/owners/{id}/heartbeat', summary: 'Keep an owner session alive', reply: api.OwnerSchema },
  { method: 'delete', path: '/v1/owners/{id}', summary: 'Close an owner session (its sandboxes get their onOwnerLost action)', status: 204 },
  { method: 'put', path: '/v1/pools/{name}', summary: 'Create or replace a warm pool', body: api.PutPoolRequestSchema, reply: api.PoolSchema },
  { method: 'get', path: '/v1/pools', summary: 'List warm pools (followed with Accept: application/vnd.dsec.follow+ndjson)', reply: page(api.PoolSchema) },
  { method: 'get', path: '/v1/pools/{name}', summary: 'Get a warm pool', reply: api.PoolSchema },
  { method: 'delete', path: '/v1/pools/{name}', summary: 'Delete a warm pool and its ready sandboxes', status: 204 },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/diff',
    summary: 'Files added, changed and deleted against the layers, with sha256',
    query: api.DiffQuerySchema,
    reply: api.DiffResultSchema,
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/verify',
    summary: 'Integrity check: sha256 of named paths',
    body: api.VerifyRequestSchema,
    reply: api.VerifyResultSchema,
  },
  { method: 'get', path: '/v1/sandboxes/{id}/network', summary: 'Network policy, addresses and counters of a sandbox', reply: api.SandboxNetworkSchema },
  {
    method: 'put',
    path: '/v1/sandboxes/{id}/network',
    summary: 'Replace the network policy of a sandbox',
    body: api.NetworkPolicySchema,
    reply: api.SandboxNetworkSchema,
  },
  {
    method: 'patch',
    path: '/v1/sandboxes/{id}/network',
    summary: 'Patch the network policy of a sandbox',
    body: api.NetworkPolicyPatchSchema,
    reply: api.SandboxNetworkSchema,
  },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/network/log',
    summary: 'Latest egress attempts of a sandbox with their verdicts (followed with Accept: application/vnd.dsec.follow+ndjson)',
    query: api.NetworkLogQuerySchema,
    reply: page(api.EgressLogEntrySchema),
  },
  {
    method: 'post',
    path: '/v1/network:apply',
    summary: 'Replace or patch the network policy of every sandbox matching a label selector',
    body: api.ApplyNetworkRequestSchema,
    reply: api.ApplyNetworkResultSchema,
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/exec',
    summary: 'Run a command (ndjson stream with Accept: application/x-ndjson; binary frames with Accept: application/vnd.dsec.exec-frames)',
    body: api.ExecRequestSchema,
    reply: api.ExecReplySchema,
  },
  { method: 'get', path: '/v1/sandboxes/{id}/exec/ws', summary: 'Interactive command over WebSocket', body: api.WsExecRequestSchema },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/processes',
    summary: 'List processes (followed with Accept: application/vnd.dsec.follow+ndjson)',
    reply: page(api.ProcessSchema),
  },
  { method: 'get', path: '/v1/sandboxes/{id}/processes/{pid}/output', summary: 'Read output from byte offsets', query: api.OutputQuerySchema, reply: 'ndjson' },
  { method: 'post', path: '/v1/sandboxes/{id}/processes/{pid}/stdin', summary: 'Write to stdin', body: 'binary', status: 204 },
  { method: 'post', path: '/v1/sandboxes/{id}/processes/{pid}/signal', summary: 'Signal a process', body: api.SignalRequestSchema, status: 204 },
  { method: 'put', path: '/v1/sandboxes/{id}/files', summary: 'Write a file', query: api.FilePathQuerySchema, body: 'binary', status: 204 },
  { method: 'get', path: '/v1/sandboxes/{id}/files', summary: 'Read a file', query: api.FilePathQuerySchema, reply: 'binary' },
  { method: 'delete', path: '/v1/sandboxes/{id}/files', summary: 'Remove a file or tree', query: api.FilePathQuerySchema, status: 204 },
  { method: 'get', path: '/v1/sandboxes/{id}/files/list', summary: 'List a directory', query: api.FilePathQuerySchema, reply: page(api.FileStatSchema) },
  { method: 'get', path: '/v1/sandboxes/{id}/files/stat', summary: 'Stat a path', query: api.FilePathQuerySchema, reply: api.FileStatSchema },
  { method: 'post', path: '/v1/sandboxes/{id}/files/mkdir', summary: 'mkdir -p', query: api.FilePathQuerySchema, status: 204 },
  { method: 'post', path: '/v1/sandboxes/{id}/files/rename', summary: 'Rename a path', body: api.RenameRequestSchema, status: 204 },
  { method: 'put', path: '/v1/sandboxes/{id}/files/tar', summary: 'Unpack a tar into a directory', query: api.FilePathQuerySchema, body: 'binary' },
  { method: 'get', path: '/v1/sandboxes/{id}/files/tar', summary: 'Download a directory as tar', query: api.FilePathQuerySchema, reply: 'binary' },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/snapshot',
    summary: "Pack the sandbox's writable layer into a snapshot layer",
    body: api.SnapshotRequestSchema,
    reply: api.LayerSchema,
    status: 201,
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/fork',
    summary: 'Snapshot, then create count sandboxes from it (with memory: true, VMs resuming from a copy of its memory and disk)',
    body: api.ForkRequestSchema,
    reply: api.ForkResultSchema,
    status: 201,
  },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/trajectory',
    summary: "A page of the sandbox's recorded steps (followed with Accept: application/vnd.dsec.follow+ndjson)",
    query: api.TrajectoryQuerySchema,
    reply: api.TrajectorySchema,
  },
  {
    method: 'post',
    path: '/v1/sandboxes/{id}/replay',
    summary: 'Re-run the trajectory on a fresh sandbox (ndjson progress with Accept: application/x-ndjson)',
    body: api.ReplayRequestSchema,
    reply: api.ReplayResultSchema,
    status: 201,
  },
  { method: 'post', path: '/v1/calls', summary: 'Run one stateless call in a fresh sandbox', body: api.CallRequestSchema, reply: api.CallResultSchema },
  {
    method: 'post',
    path: '/v1/calls/batch',
    summary: 'Run up to 1,000 calls; results in request order',
    body: api.CallBatchRequestSchema,
    reply: api.CallBatchResultSchema,
  },
  {
    method: 'post',
    path: '/v1/layers',
    summary: 'Upload a layer (tar or OCI image), or a qcow2/raw disk image (format=disk)',
    query: api.UploadLayerQuerySchema,
    body: 'binary',
    reply: api.LayerSchema,
    status: 201,
  },
  { method: 'post', path: '/v1/layers/debian', summary: 'Build a Debian layer', body: api.DebianLayerRequestSchema, reply: api.LayerSchema, status: 201 },
  {
    method: 'post',
    path: '/v1/layers/vm',
    summary: 'Build a bootable VM disk image (a disk layer)',
    body: api.VmLayerRequestSchema,
    reply: api.LayerSchema,
    status: 201,
  },
  {
    method: 'get',
    path: '/v1/disk-images/{ref}',
    summary: "Download a disk layer's image, or a full VM snapshot's (query format: raw or qcow2)",
    reply: 'binary',
  },
  { method: 'get', path: '/v1/layers', summary: 'List layers (followed with Accept: application/vnd.dsec.follow+ndjson)', reply: page(api.LayerSchema) },
  { method: 'get', path: '/v1/layers/{ref}', summary: 'Get a layer', reply: api.LayerSchema },
  { method: 'patch', path: '/v1/layers/{ref}', summary: 'Share a snapshot with sub-projects', body: api.UpdateLayerRequestSchema, reply: api.LayerSchema },
  { method: 'delete', path: '/v1/layers/{ref}', summary: 'Delete a layer', status: 204 },
  { method: 'post', path: '/v1/keys', summary: 'Create an API key', body: api.CreateKeyRequestSchema, reply: api.ApiKeySchema, status: 201 },
  { method: 'get', path: '/v1/keys', summary: 'List API keys (followed with Accept: application/vnd.dsec.follow+ndjson)', reply: page(api.ApiKeySchema) },
  { method: 'delete', path: '/v1/keys/{id}', summary: 'Revoke an API key', status: 204 },
  // Browser clients (the dashboard): the calling key, and single-use WebSocket tickets (ws-tickets.ts).
  {
    method: 'get',
    path: '/v1/whoami',
    summary: 'The calling key: its id, project, role and tenant',
    reply: z.object({ keyId: z.string(), project: z.string(), role: z.enum(['viewer', 'member', 'admin']), tenant: z.string() }),
  },
  {
    method: 'post',
    path: '/v1/ws-tickets',
    summary: 'A single-use ticket (valid 30 s) to open one WebSocket as this key: offer it as the sub-protocol dsec.ticket.<ticket> with dsec.v1',
    reply: z.object({ ticket: z.string(), expiresAt: z.string() }),
    status: 201,
  },
  { method: 'post', path: '/v1/projects', summary: 'Create a sub-project', body: api.CreateProjectRequestSchema, reply: api.ProjectSchema, status: 201 },
  { method: 'get', path: '/v1/projects', summary: 'List projects', reply: page(api.ProjectSchema) },
  { method: 'get', path: '/v1/projects/{id}', summary: 'Get a project', reply: api.ProjectSchema },
  {
    method: 'get',
    path: '/v1/nodes',
    summary:
      'Nodes with state, capacity and use (with Accept: application/x-ndjson the node usage stream, a sample every intervalMs); allocation, sandboxes, use, layer cache, address and the machine only for keys of the root project (null for the others), in the list as in the stream',
    reply: page(api.NodeDetailSchema),
  },
  { method: 'get', path: '/v1/nodes/{name}', summary: 'One node in full (admin of the root project)', reply: api.NodeDetailSchema },
  {
    method: 'post',
    path: '/v1/nodes/join-tokens',
    summary: 'A single-use join token for dsec edge --join',
    body: api.JoinTokenRequestSchema,
    reply: api.JoinTokenSchema,
    status: 201,
  },
  { method: 'post', path: '/v1/nodes/{name}/cordon', summary: 'Stop placing sandboxes on a node', reply: api.NodeDetailSchema },
  { method: 'post', path: '/v1/nodes/{name}/uncordon', summary: 'Place sandboxes on a node again', reply: api.NodeDetailSchema },
  {
    method: 'post',
    path: '/v1/nodes/{name}/drain',
    summary: 'Cordon a node; with replay, recreate its sandboxes elsewhere from their trajectories',
    body: api.DrainRequestSchema,
    reply: api.DrainResultSchema,
  },
  { method: 'delete', path: '/v1/nodes/{name}', summary: 'Remove a joined node (its certificate is revoked)', status: 204 },
  {
    method: 'get',
    path: '/v1/events',
    summary: 'Events (a live text/event-stream with Accept: text/event-stream; Last-Event-ID resumes)',
    query: api.ListEventsQuerySchema,
    reply: page(api.EventSchema),
  },
  {
    method: 'get',
    path: '/v1/audit',
    summary: 'Audit trail (NDJSON export with Accept: application/x-ndjson; followed with Accept: application/vnd.dsec.follow+ndjson)',
    query: api.ListAuditQuerySchema,
    reply: page(api.AuditEntrySchema),
  },
  { method: 'post', path: '/v1/rules', summary: 'Add a run-time rule', body: api.CreateRuleRequestSchema, reply: api.RuleSchema, status: 201 },
  { method: 'get', path: '/v1/rules', summary: 'List rules', reply: page(api.RuleSchema) },
  { method: 'delete', path: '/v1/rules/{id}', summary: 'Delete a rule', status: 204 },
  ...COMPAT_ROUTES,
];

function jsonSchema(s: Schema, io: 'input' | 'output'): unknown {
  return z.toJSONSchema(s, { io, unrepresentable: 'any', target: 'draft-2020-12' });
}

let cached: unknown;

/** The OpenAPI document of the HTTP API. */
export function openApiDocument(): unknown {
  if (cached) return cached;
  const paths: Record<string, Record<string, unknown>> = {};
  for (const r of ROUTES) {
    const op: Record<string, unknown> = { summary: r.summary, security: r.security ?? [{ bearer: [] }] };
    const params = [...r.path.matchAll(/\{(\w+)\}/g)].map((m) => ({ name: m[1], in: 'path', required: true, schema: { type: 'string' } }));
    if (r.query) {
      const q = jsonSchema(r.query, 'input') as { properties?: Record<string, unknown>; required?: string[] };
      for (const [name, schema] of Object.entries(q.properties ?? {}))
        params.push({ name, in: 'query', required: (q.required ?? []).includes(name), schema } as never);
    }
    for (const name of r.headers ?? []) params.push({ name, in: 'header', required: false, schema: { type: 'string' } });
    if (params.length) op.parameters = params;
    if (r.body === 'binary') op.requestBody = { content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } };
    else if (r.form) op.requestBody = { required: true, content: { 'multipart/form-data': { schema: { type: 'object', properties: r.form } } } };
    else if (r.body) op.requestBody = { required: true, content: { 'application/json': { schema: jsonSchema(r.body, 'input') } } };
    const status = String(r.status ?? 200);
    const content =
      r.reply === 'binary'
        ? { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } }
        : r.reply === 'png'
          ? { 'image/png': { schema: { type: 'string', format: 'binary' } } }
          : r.reply === 'ndjson'
            ? { 'application/x-ndjson': { schema: jsonSchema(api.ExecEventSchema, 'output') } }
            : r.reply
              ? { 'application/json': { schema: jsonSchema(r.reply, 'output') } }
              : undefined;
    op.responses = {
      [status]: content ? { description: 'OK', content } : { description: 'OK' },
      default: { description: 'Error', content: { 'application/json': { schema: jsonSchema(api.ErrorBodySchema, 'output') } } },
    };
    (paths[r.path] ??= {})[r.method] = op;
  }
  cached = {
    openapi: '3.1.0',
    info: { title: 'dsec API', version: '1' },
    components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' }, ...COMPAT_SECURITY_SCHEMES } },
    paths,
  };
  return cached;
}
