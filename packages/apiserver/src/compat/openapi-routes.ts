// The compatibility protocols in the OpenAPI document: SandboxFusion (key header or endpoint
// token in the path), endpoint tokens, and SWE-ReX's runtime per sandbox (key in X-API-Key).
import { z } from 'zod';
import type { Route } from '../openapi.js';
import { CreateEndpointTokenRequestSchema } from './endpoint-tokens.js';
import { RunCodeRequestSchema, RunCodeResponseSchema } from './sandboxfusion.js';
import { ActionSchema, CloseSessionSchema, CommandSchema, CreateSessionSchema, ReadFileSchema, WriteFileSchema } from './swerex.js';

const EndpointTokenSchema = z.object({
  id: z.string(),
  name: z.string(),
  project: z.string(),
  protocol: z.literal('sandboxfusion'),
  createdBy: z.string(),
  createdAt: z.string(),
  revokedAt: z.string().nullable(),
  token: z.string().optional().describe('only in the reply that made it'),
  path: z.string().optional().describe('`/v1/sandboxfusion/t/<token>`: append `/run_code`'),
});

const ObservationSchema = z.object({
  output: z.string(),
  exit_code: z.number().nullable(),
  failure_reason: z.string(),
  expect_string: z.string(),
  session_type: z.literal('bash'),
});

const noAuth: Array<Record<string, string[]>> = [];
const swerexAuth = [{ swerexApiKey: [] }, { bearer: [] }];
const swerex = (endpoint: string, summary: string, body?: z.ZodType, reply?: z.ZodType): Route => ({
  method: 'post',
  path: `/v1/sandboxes/{id}/swerex/${endpoint}`,
  summary: `SWE-ReX: ${summary} (failures: HTTP 511 {"swerexception": {message, class_path, traceback, extra_info}})`,
  ...(body ? { body } : {}),
  ...(reply ? { reply } : {}),
  headers: ['X-Request-ID'],
  security: swerexAuth,
});

/** Security schemes of the compatibility routes. */
export const COMPAT_SECURITY_SCHEMES = { swerexApiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' } };

/** The compatibility routes. */
export const COMPAT_ROUTES: Route[] = [
  {
    method: 'post',
    path: '/v1/sandboxfusion/run_code',
    summary: 'SandboxFusion: run code (python, pytest, bash, nodejs, c, cpp, go, java) on the fncall backend; HTTP 200 for every outcome',
    body: RunCodeRequestSchema,
    reply: RunCodeResponseSchema,
  },
  { method: 'get', path: '/v1/sandboxfusion/v1/ping', summary: 'SandboxFusion: ping ("pong")', reply: z.literal('pong') },
  {
    method: 'post',
    path: '/v1/sandboxfusion/t/{token}/run_code',
    summary: 'SandboxFusion run_code for clients without headers: an endpoint token in the path',
    body: RunCodeRequestSchema,
    reply: RunCodeResponseSchema,
    security: noAuth,
  },
  {
    method: 'get',
    path: '/v1/sandboxfusion/t/{token}/v1/ping',
    summary: 'SandboxFusion ping with an endpoint token in the path',
    reply: z.literal('pong'),
    security: noAuth,
  },
  {
    method: 'post',
    path: '/v1/endpoint-tokens',
    summary: 'Create an endpoint token (admin; the secret is in this reply only)',
    body: CreateEndpointTokenRequestSchema,
    reply: EndpointTokenSchema,
    status: 201,
  },
  {
    method: 'get',
    path: '/v1/endpoint-tokens',
    summary: 'List endpoint tokens (no secrets)',
    reply: z.object({ items: z.array(EndpointTokenSchema), nextCursor: z.null() }),
  },
  { method: 'delete', path: '/v1/endpoint-tokens/{id}', summary: 'Revoke an endpoint token', status: 204 },
  {
    method: 'get',
    path: '/v1/sandboxes/{id}/swerex/is_alive',
    summary: 'SWE-ReX: is the runtime alive',
    reply: z.object({ is_alive: z.boolean(), message: z.string() }),
    security: swerexAuth,
  },
  swerex('create_session', 'start a bash session', CreateSessionSchema, z.object({ output: z.string(), session_type: z.literal('bash') })),
  swerex('run_in_session', 'run a command in a session, or interrupt it (action_type bash_interrupt)', ActionSchema, ObservationSchema),
  swerex('close_session', 'close a session', CloseSessionSchema, z.object({ session_type: z.literal('bash') })),
  swerex('execute', 'run a command outside any session', CommandSchema, z.object({ stdout: z.string(), stderr: z.string(), exit_code: z.number().nullable() })),
  swerex('read_file', 'read a file', ReadFileSchema, z.object({ content: z.string() })),
  swerex('write_file', 'write a file (parents made)', WriteFileSchema, z.object({})),
  {
    ...swerex('upload', 'upload a file, or a zip unpacked into target_path (unzip "true")', undefined, z.object({})),
    form: { file: { type: 'string', format: 'binary' }, target_path: { type: 'string' }, unzip: { type: 'string' } },
  },
  swerex('close', 'close every session of the sandboxes runtime (the sandbox stays); no body', undefined, z.object({})),
];
