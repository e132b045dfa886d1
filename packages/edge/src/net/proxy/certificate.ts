// A self-signed certificate made at run time, for the TLS upstreams that tests and benchmarks
// of the egress proxy start on loopback (the proxy itself never terminates TLS).
import { execFileSync } from 'node:child_process';
import { isIP } from 'node:net';
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

/** A certificate authority made at run time (EC P-256, valid two days), as an operator's TLS-intercepting proxy has. */
export interface TestCertificateAuthority {
  key: string;
  cert: string;
  /** A server certificate for `names` (subjectAltName entries, DNS names or IP addresses; the first is the CN), signed by this CA. */
  issue(names: string[]): Promise<{ key: string; cert: string }>;
}

/** Makes a CA with openssl (tests and benchmarks: the operator CA a sandbox must come to trust). */
export async function makeCertificateAuthority(commonName = 'dsec test CA'): Promise<TestCertificateAuthority> {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-ca-'));
  try {
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        ...ec,
        '-keyout',
        path.join(dir, 'key.pem'),
        '-out',
        path.join(dir, 'cert.pem'),
        '-days',
        '2',
        '-subj',
        `/CN=${commonName}`,
        '-addext',
        'basicConstraints=critical,CA:TRUE',
        '-addext',
        'keyUsage=critical,keyCertSign,cRLSign',
      ],
      { stdio: 'pipe' },
    );
    const key = await readFile(path.join(dir, 'key.pem'), 'utf8');
    const cert = await readFile(path.join(dir, 'cert.pem'), 'utf8');
    return { key, cert, issue: (names) => issueCertificate({ key, cert }, names) };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function issueCertificate(ca: { key: string; cert: string }, names: string[]): Promise<{ key: string; cert: string }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-cert-'));
  try {
    const { writeFile } = await import('node:fs/promises');
    const p = (n: string): string => path.join(dir, n);
    await writeFile(p('ca.key'), ca.key, { mode: 0o600 });
    await writeFile(p('ca.pem'), ca.cert);
    await writeFile(
      p('ext.cnf'),
      `subjectAltName=${names.map((n) => (isIP(n) ? `IP:${n}` : `DNS:${n}`)).join(',')}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n`,
    );
    execFileSync(
      'openssl',
      [
        'req',
        '-new',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        p('key.pem'),
        '-out',
        p('req.csr'),
        '-subj',
        `/CN=${names[0] ?? 'localhost'}`,
      ],
      {
        stdio: 'pipe',
      },
    );
    execFileSync(
      'openssl',
      [
        'x509',
        '-req',
        '-in',
        p('req.csr'),
        '-CA',
        p('ca.pem'),
        '-CAkey',
        p('ca.key'),
        '-CAcreateserial',
        '-out',
        p('cert.pem'),
        '-days',
        '2',
        '-extfile',
        p('ext.cnf'),
      ],
      { stdio: 'pipe' },
    );
    return { key: await readFile(p('key.pem'), 'utf8'), cert: await readFile(p('cert.pem'), 'utf8') };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
