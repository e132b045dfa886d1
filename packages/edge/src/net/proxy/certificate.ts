// A self-signed certificate made at run time, for the TLS upstreams that tests and benchmarks
// of the egress proxy start on loopback (the proxy itself never terminates TLS).
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** A self-signed certificate (EC P-256, valid two days) for `name`, in its CN and subjectAltName, made with openssl. */
export async function makeCertificate(name: string): Promise<{ key: string; cert: string }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-cert-'));
  try {
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        path.join(dir, 'key.pem'),
        '-out',
        path.join(dir, 'cert.pem'),
        '-days',
        '2',
        '-subj',
        `/CN=${name}`,
        '-addext',
        `subjectAltName=DNS:${name}`,
      ],
      { stdio: 'pipe' },
    );
    return { key: await readFile(path.join(dir, 'key.pem'), 'utf8'), cert: await readFile(path.join(dir, 'cert.pem'), 'utf8') };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
