// The few certificate operations a cluster needs, on the openssl command line (Node's crypto
// cannot sign certificates): keys, signing requests and fingerprints. The control plane's CA
// (@dsec/apiserver cluster/ca.ts) and the node agent share them.
import { execFile } from 'node:child_process';
import { X509Certificate, createHash } from 'node:crypto';
import { chmod } from 'node:fs/promises';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';

const run = promisify(execFile);

/** Runs openssl in `cwd`; its first line of stderr becomes the error's message. */
export async function openssl(args: string[], cwd?: string): Promise<string> {
  try {
    const { stdout } = await run('openssl', args, { ...(cwd ? { cwd } : {}), maxBuffer: 1 << 20 });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new DsecError('INTERNAL', `openssl ${args[0]}: ${(e.stderr || e.message).trim().split('\n')[0]}`);
  }
}

/** Hex SHA-256 of a PEM certificate's DER bytes (what a join token carries of the CA). */
export function certSha256(pem: string): string {
  return createHash('sha256').update(new X509Certificate(pem).raw).digest('hex');
}

/** Makes a P-256 private key (PEM) at `keyPath`, mode 0600. */
export async function makeKey(keyPath: string): Promise<void> {
  await openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', keyPath]);
  await chmod(keyPath, 0o600);
}

/** A PEM certificate signing request of the key at `keyPath`, common name `cn`. */
export async function makeCsr(keyPath: string, cn: string): Promise<string> {
  return openssl(['req', '-new', '-key', keyPath, '-subj', `/CN=${cn}`]);
}
