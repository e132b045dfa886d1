// The cluster CA: a key and certificate that `dsec` makes on first start under
// `$DSEC_HOME/cluster/` (openssl, EC P-256), the control plane's own server certificate for the
// node port, and the node certificates it signs at join. Replicas sharing the directory share
// the CA. The CA key never leaves the control plane; a node's key never leaves the node.
import { X509Certificate, createHash, randomBytes } from 'node:crypto';
import { access, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { CONTROL_PLANE_TLS_NAME, invalidArgument } from '@dsec/protocol';

/**
 * The certificate tools the CA runs (the node's own, from @dsec/edge, handed over by the
 * composition root): openssl in a directory with an input on stdin, a P-256 key, a CSR.
 */
export interface CertTools {
  openssl: (args: string[], cwd?: string, input?: string) => Promise<string>;
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
/** The extensions of a node's certificate (a client of the node port), a file in the CA's directory. */
const NODE_EXTENSIONS_FILE = 'node-ext.cnf';

/**
 * openssl's refusals of a CSR (one it cannot read, one whose key it cannot unpack, one whose
 * self-signature does not verify or names an unknown algorithm),
 * as opposed to failures of the CA itself (its key unreadable).
 */
const CSR_REFUSED =
  /unable to load certificate request|self-signature (did not match|verify failure)|error while verifying certificate request self-signature|error unpacking public key from CSR/i;

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
    // One extensions file per kind of certificate, written once at open, so that a node's
    // join spawns one openssl and writes no file. Replicas sharing the directory write the
    // same bytes (tmp + rename: a signing never reads half a file).
    await writeExtensions(p(NODE_EXTENSIONS_FILE), 'clientAuth', []);
    if (!(await exists(p('server.crt')))) {
      await makeKey(p('server.key'));
      const csr = await makeCsr(p('server.key'), CONTROL_PLANE_TLS_NAME);
      await writeExtensions(p('server-ext.cnf'), 'serverAuth', [`DNS:${CONTROL_PLANE_TLS_NAME}`]);
      const cert = await signCsr(tools, dir, csr, CONTROL_PLANE_TLS_NAME, 'server-ext.cnf');
      await writeFile(p('server.crt'), cert, { mode: 0o600 });
    }
    return new ClusterCa(tools, dir, await readFile(p('ca.crt'), 'utf8'), await readFile(p('server.key'), 'utf8'), await readFile(p('server.crt'), 'utf8'));
  }

  /** Signs a node's CSR as a client certificate for `name` (the CSR's subject must be CN=`name`). */
  async signNode(csrPem: string, name: string): Promise<string> {
    return signCsr(this.tools, this.dir, csrPem, name, NODE_EXTENSIONS_FILE);
  }
}

/** Writes the extensions of one kind of certificate the CA signs. */
async function writeExtensions(file: string, usage: 'clientAuth' | 'serverAuth', san: string[]): Promise<void> {
  const ext = [`extendedKeyUsage=${usage}`, 'basicConstraints=critical,CA:FALSE', 'keyUsage=critical,digitalSignature'];
  if (san.length) ext.push(`subjectAltName=${san.join(',')}`);
  const text = ext.join('\n') + '\n';
  // Written already (by this or another replica): a CA directory need not be writable after its first start.
  if ((await readFile(file, 'utf8').catch(() => undefined)) === text) return;
  const tmp = `${file}.${randomBytes(4).toString('hex')}.tmp`;
  await writeFile(tmp, text, { mode: 0o600 });
  await rename(tmp, file);
}

/**
 * Signs a CSR (on openssl's stdin) with the CA in `dir` and the extensions in `extFile` (in
 * `dir`): one openssl, which refuses a CSR whose self-signature does not verify. The subject is
 * the CSR's, checked on the certificate made: one not exactly CN=`name` is refused and its
 * certificate dropped (it never leaves this function).
 */
async function signCsr({ openssl }: CertTools, dir: string, csrPem: string, name: string, extFile: string): Promise<string> {
  const args = [
    'x509',
    '-req',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-set_serial',
    `0x${randomBytes(16).toString('hex')}`,
    '-days',
    String(CERT_DAYS),
    '-extfile',
    extFile,
  ];
  const cert = await openssl(args, dir, csrPem).catch((err: unknown) => {
    if (err instanceof Error && CSR_REFUSED.test(err.message)) throw invalidArgument('csr', 'not a valid certificate signing request');
    throw err;
  });
  if (new X509Certificate(cert).subject !== `CN=${name}`) throw invalidArgument('csr', `the request's subject must be CN=${name}`);
  return cert;
}

async function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}
