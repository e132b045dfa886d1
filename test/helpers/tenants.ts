// Tenants for the end-to-end tests: a project made by the platform's root admin key, with one
// key per role in it (the setup that test files used to write each for themselves).
import assert from 'node:assert/strict';
import type { TestPlatform } from './platform.js';

/** A project and a key of each role acting in it. */
export interface TestProject {
  id: string;
  admin: string;
  member: string;
  viewer: string;
}

/** Options of {@link testProject}. */
export interface TestProjectOptions {
  /** Makes a sub-project of this project. Default: a project of the root. */
  parent?: string;
  /** The project's quota (the API's default when absent). */
  quota?: object;
}

async function post(platform: Pick<TestPlatform, 'url' | 'adminKey'>, route: string, json: object): Promise<any> {
  const res = await fetch(platform.url + route, {
    method: 'POST',
    headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json' },
    body: JSON.stringify(json),
  });
  const text = await res.text();
  assert.equal(res.status, 201, `POST ${route}: ${text}`);
  return JSON.parse(text);
}

/** Makes project `name` (through the API, as the root admin) and an admin, a member and a viewer key in it. */
export async function testProject(platform: Pick<TestPlatform, 'url' | 'adminKey'>, name: string, o: TestProjectOptions = {}): Promise<TestProject> {
  const p = await post(platform, '/v1/projects', { name, ...(o.parent ? { parent: o.parent } : {}), ...(o.quota ? { quota: o.quota } : {}) });
  const key = async (role: string): Promise<string> => (await post(platform, '/v1/keys', { name: `${name}-${role}`, role, project: p.id })).key as string;
  return { id: p.id as string, admin: await key('admin'), member: await key('member'), viewer: await key('viewer') };
}
