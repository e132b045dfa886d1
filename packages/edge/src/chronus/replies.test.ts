import assert from 'node:assert/strict';
import { test } from 'node:test';
import { agentError } from './replies.js';
import { F, Fields, encodeFields } from './wire.js';

const reply = (errno: number): Fields => new Fields(encodeFields([[F.ERRNO, errno]]));

test("an agent's errno becomes a stable code; an operation the agent lacks is the caller's 400, not the node's 502", () => {
  const missing = agentError(reply(2), 'stat', '/x');
  assert.equal(missing.code, 'FILE_NOT_FOUND');
  const badPath = agentError(reply(20), 'stat', '/x/y');
  assert.equal(badPath.status, 400);
  assert.equal(badPath.details.field, 'path');
  for (const errno of [38, 95]) {
    const e = agentError(reply(errno), 'xattrs', '/x');
    assert.equal(e.status, 400, `errno ${errno}`);
    assert.equal(e.details.field, undefined, 'the path is not what is wrong');
  }
  assert.equal(agentError(reply(5), 'read').code, 'BACKEND_FAILED');
});
