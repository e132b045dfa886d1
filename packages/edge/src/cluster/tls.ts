// The few certificate operations a cluster needs: keys (node:crypto), signing requests and
// certificates on the openssl command line (Node's crypto cannot make either), fingerprints. The control plane's CA
// (@dsec/apiserver cluster/ca.ts) and the node agent share them.
import { execFile } from 'node:child_process';
import { X509Certificate, createHash, generateKeyPair } from 'node:crypto';
import { chmod, writeFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';

const run = promisify(execFile);

const generateKeyPairAsync = promisify(generateKeyPair);

/** Runs openssl in `cwd` with `input` on its stdin; its first line of stderr becomes the error's message. */
export async function openssl(args: string[], cwd?: string, input?: string): Promise<string> {
  try {
    const running = run('openssl', args, { ...(cwd ? { cwd } : {}), maxBuffer: 1 << 20 });
    // openssl may exit without reading its input (bad arguments, or none wanted): the pipe's
    // error is then moot, its exit status tells.
    running.child.stdin?.on('error', () => undefined);
    if (input === undefined) running.child.stdin?.end();
    else running.child.stdin?.end(input);
    const { stdout } = await running;
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

/**
 * Makes a P-256 private key (PKCS#8 PEM, as `openssl genpkey` writes it) at `keyPath`, mode
 * 0600. Made in process: a node joining or a CA starting spawns no openssl for its key.
 */
export async function makeKey(keyPath: string): Promise<void> {
  const { privateKey } = await generateKeyPairAsync('ec', { namedCurve: 'P-256' });
  await writeFile(keyPath, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
  await chmod(keyPath, 0o600);
}

/** A PEM certificate signing request of the key at `keyPath`, common name `cn`. */
export async function makeCsr(keyPath: string, cn: string): Promise<string> {
  return openssl(['req', '-new', '-key', keyPath, '-subj', `/CN=${cn}`]);
}
