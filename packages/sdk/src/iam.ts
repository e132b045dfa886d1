// API keys and projects.
import { CreateKeyRequestSchema, CreateProjectRequestSchema, invalidArgument } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';
import type { ApiKeyInfo, KeyCreateRequest, ProjectCreateRequest, ProjectInfo } from './types.js';
import { validate } from './validate.js';

function checkId(id: string, field: string): string {
  if (typeof id !== 'string' || !/^[A-Za-z0-9._:-]{1,128}$/.test(id)) throw invalidArgument(field, 'not an id');
  return id;
}

/** API keys of the caller's project and its descendants. */
export class KeysApi {
  constructor(private readonly client: DsecClient) {}

  /** Creates a key; the reply's `key` is the secret, shown only this once. */
  async create(req: KeyCreateRequest, opts: CallOptions = {}): Promise<ApiKeyInfo & { key: string }> {
    const body = validate(CreateKeyRequestSchema, req);
    return this.client.json({ method: 'POST', path: '/v1/keys', body }, opts);
  }

  /** Lists keys (without secrets). */
  async list(opts: CallOptions = {}): Promise<ApiKeyInfo[]> {
    return (await this.client.json<{ items: ApiKeyInfo[] }>({ method: 'GET', path: '/v1/keys' }, opts)).items;
  }

  /** Revokes a key; requests made with it fail with UNAUTHENTICATED from then on. */
  async revoke(id: string, opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'DELETE', path: `/v1/keys/${encodeURIComponent(checkId(id, 'id'))}` }, opts);
  }
}

/** The caller's project and its sub-projects. */
export class ProjectsApi {
  constructor(private readonly client: DsecClient) {}

  /** Creates a sub-project (of the caller's project, or of `parent`). */
  async create(req: ProjectCreateRequest, opts: CallOptions = {}): Promise<ProjectInfo> {
    const body = validate(CreateProjectRequestSchema, req);
    return this.client.json({ method: 'POST', path: '/v1/projects', body }, opts);
  }

  /** Lists the caller's project and its descendants with quota and usage. */
  async list(opts: CallOptions = {}): Promise<ProjectInfo[]> {
    return (await this.client.json<{ items: ProjectInfo[] }>({ method: 'GET', path: '/v1/projects' }, opts)).items;
  }

  /** One project. */
  async get(id: string, opts: CallOptions = {}): Promise<ProjectInfo> {
    return this.client.json({ method: 'GET', path: `/v1/projects/${encodeURIComponent(checkId(id, 'id'))}` }, opts);
  }
}
