// The cluster CA: a key and certificate that `dsec` makes on first start under
// `$DSEC_HOME/cluster/` (openssl, EC P-256), the control plane's own server certificate for the
// node port, and the node certificates it signs at join. Replicas sharing the directory share
// the CA. The CA key never leaves the control plane; a node's key never leaves the node.
import { X509Certificate, createHash, randomBytes } from 'node:crypto';
import { access, mkdir, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { CONTROL_PLANE_TLS_NAME, invalidArgument } from '@dsec/protocol';

/**
 * The certificate tools the CA runs (the node's own, from @dsec/edge, handed over by the
 * composition root): openssl in a directory, a P-256 key, a CSR.
 */
export interface CertTools {
  openssl: (args: string[], cwd?: string) => Promise<string>;
  makeKey: (keyPath: string) => Promise<void>;
  makeCsr: (keyPath: string, cn: string) => Promise<string>;
}

/** Hex SHA-256 of a PEM certificate's DER bytes. */
function certSha256(pem: string): string {
  return createHash('sha256').update(new X509Certificate(pem).raw).digest('hex');
}

/** Lifetime of the CA. */
const CA_DAYS = 3650;
/** Lifetime of a node's and of the server's certificate. */
const CERT_DAYS = 825;

/** The cluster CA and the node port's server certificate. */
export class ClusterCa {
  private constructor(
    private readonly tools: CertTools,
    readonly dir: string,
    /** CA certificate (PEM). */
    readonly caPem: string,
    /** Server key and certificate of the node port (PEM). */
    readonly serverKeyPem: string,
    readonly serverCertPem: string,
  ) {}

  /** Hex SHA-256 of the CA certificate. */
  get caSha256(): string {
    return certSha256(this.caPem);
  }

  /** Opens the CA in `dir` (made 0700), making the CA and the server certificate on first use. */
  static async open(dir: string, tools: CertTools): Promise<ClusterCa> {
    const { openssl, makeKey, makeCsr } = tools;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const p = (f: string): string => path.join(dir, f);
    if (!(await exists(p('ca.crt')))) {
      await makeKey(p('ca.key.tmp'));
      await openssl(['req', '-x509', '-new', '-key', p('ca.key.tmp'), '-days', String(CA_DAYS), '-subj', '/CN=dsec cluster CA', '-out', p('ca.crt.tmp')]);
      await rename(p('ca.key.tmp'), p('ca.key'));
      await rename(p('ca.crt.tmp'), p('ca.crt'));
    }
    if (!(await exists(p('server.crt')))) {
      await makeKey(p('server.key'));
      const csr = await makeCsr(p('server.key'), CONTROL_PLANE_TLS_NAME);
      const cert = await signCsr(tools, dir, csr, CONTROL_PLANE_TLS_NAME, 'serverAuth', [`DNS:${CONTROL_PLANE_TLS_NAME}`]);
      await writeFile(p('server.crt'), cert, { mode: 0o600 });
    }
    return new ClusterCa(tools, dir, await readFile(p('ca.crt'), 'utf8'), await readFile(p('server.key'), 'utf8'), await readFile(p('server.crt'), 'utf8'));
  }

  /** Signs a node's CSR as a client certificate for `name` (the CSR's common name must be `name`). */
  async signNode(csrPem: string, name: string): Promise<string> {
    return signCsr(this.tools, this.dir, csrPem, name, 'clientAuth', []);
  }
}

async function signCsr({ openssl }: CertTools, dir: string, csrPem: string, name: string, usage: 'clientAuth' | 'serverAuth', san: string[]): Promise<string> {
  const work = await mkdtemp(path.join(tmpdir(), 'dsec-csr-'));
  try {
    await writeFile(path.join(work, 'req.csr'), csrPem);
    const subject = await openssl(['req', '-in', 'req.csr', '-noout', '-verify', '-subject', '-nameopt', 'RFC2253'], work).catch(() => {
      throw invalidArgument('csr', 'not a valid certificate signing request');
    });
    if (subject.trim() !== `subject=CN=${name}`) throw invalidArgument('csr', `the request's subject must be CN=${name}`);
    const ext = [`extendedKeyUsage=${usage}`, 'basicConstraints=critical,CA:FALSE', 'keyUsage=critical,digitalSignature'];
    if (san.length) ext.push(`subjectAltName=${san.join(',')}`);
    await writeFile(path.join(work, 'ext.cnf'), ext.join('\n') + '\n');
    return await openssl(
      [
        'x509',
        '-req',
        '-in',
        'req.csr',
        '-CA',
        path.join(dir, 'ca.crt'),
        '-CAkey',
        path.join(dir, 'ca.key'),
        '-set_serial',
        `0x${randomBytes(16).toString('hex')}`,
        '-days',
        String(CERT_DAYS),
        '-extfile',
        'ext.cnf',
      ],
      work,
    );
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

async function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}
