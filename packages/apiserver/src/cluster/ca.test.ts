// The cluster CA signs a node's CSR with one openssl: a certificate of the CA for the CSR's key,
// a client certificate named as the node; a CSR with another subject, or whose self-signature
// does not verify (a key that is not the requester's), is refused with the field named.
import assert from 'node:assert/strict';
import { X509Certificate, createPublicKey } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { makeCsr, makeKey, openssl } from '@dsec/edge';
import { ClusterCa } from './ca.js';

let dir: string;
let ca: ClusterCa;
before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'dsec-ca-test-'));
  ca = await ClusterCa.open(path.join(dir, 'cluster'), { openssl, makeKey, makeCsr });
});
after(async () => rm(dir, { recursive: true, force: true }));

const refusedCsr = (err: unknown): boolean => err instanceof DsecError && err.code === 'INVALID_ARGUMENT' && err.details.field === 'csr';

test("a node's CSR is signed by the CA for the node's key, as a client named as the node", async () => {
  const keyPath = path.join(dir, 'node-a.key');
  await makeKey(keyPath);
  const cert = new X509Certificate(await ca.signNode(await makeCsr(keyPath, 'node-a'), 'node-a'));
  assert.equal(cert.subject, 'CN=node-a');
  assert.equal(cert.verify(new X509Certificate(ca.caPem).publicKey), true, 'signed by the cluster CA');
  assert.equal(cert.publicKey.equals(createPublicKey(await readFile(keyPath, 'utf8'))), true, "the node's own key");
  assert.match(cert.keyUsage?.join(',') ?? '', /1\.3\.6\.1\.5\.5\.7\.3\.2/, 'clientAuth');
  assert.equal(cert.ca, false);
  // The server certificate made at open is the node port's.
  assert.match(new X509Certificate(ca.serverCertPem).subjectAltName ?? '', /DNS:/);
});

test('a CSR for another name, or one whose self-signature does not verify, is refused', async () => {
  const keyPath = path.join(dir, 'node-b.key');
  await makeKey(keyPath);
  await assert.rejects(ca.signNode(await makeCsr(keyPath, 'node-other'), 'node-b'), refusedCsr);
  // A byte of the signature changed: the request no longer proves its key.
  const csr = await makeCsr(keyPath, 'node-b');
  const der = Buffer.from(csr.replace(/-----[^-]+-----|\s/g, ''), 'base64');
  der[der.length - 5]! ^= 0xff;
  const tampered = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64').replace(/.{64}/g, '$&\n')}\n-----END CERTIFICATE REQUEST-----\n`;
  await assert.rejects(ca.signNode(tampered, 'node-b'), refusedCsr);
  await assert.rejects(ca.signNode('not a request', 'node-b'), refusedCsr);
  // A byte changed anywhere in the request's key and signature algorithm: a 400 naming csr each
  // time (before: an unpackable key or an unknown signature algorithm was a 500).
  const pem = (d: Buffer): string =>
    `-----BEGIN CERTIFICATE REQUEST-----\n${d.toString('base64').replace(/.{64}/g, '$&\n')}\n-----END CERTIFICATE REQUEST-----\n`;
  for (let i = 20; i < der.length - 8; i += 3) {
    const d = Buffer.from(csr.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    d[i]! ^= 0xff;
    await assert.rejects(ca.signNode(pem(d), 'node-b'), refusedCsr, `byte ${i}`);
  }
});
