// The operator's CA certificates (`node.network.caCertificates`) in every networked sandbox's
// trust: appended to the image's system bundle in the sandbox's own root (what apt, curl, git,
// Python's ssl and OpenSSL read by default), written alone for Node (which adds
// NODE_EXTRA_CA_CERTS to its built-in roots), and named in the variables each tool reads, so a
// sandbox works behind a TLS-intercepting proxy whose CA the operator trusts.
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { DsecError } from '@dsec/protocol';
import type { SandboxAgent } from '../backend.js';

/** Debian's (and Ubuntu's, Alpine's) system bundle. */
export const SYSTEM_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** The operator's CAs alone, for NODE_EXTRA_CA_CERTS. */
export const OPERATOR_CA_FILE = '/etc/ssl/certs/dsec-operator-ca.pem';
/** Largest system bundle read from an image (Debian's is ~220 KiB). */
const MAX_BUNDLE_BYTES = 8 * 1024 * 1024;
const BEGIN_MARK = '# dsec: operator CA certificates (node.network.caCertificates)';
const END_MARK = '# dsec: end of operator CA certificates';
const PEM_RE = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/**
 * Reads `node.network.caCertificates`: each entry is PEM text or the absolute path of a PEM
 * file (one or more certificates). Every certificate is parsed; a bad one fails the node's
 * network set-up with the entry named. Returns the certificates as one PEM text.
 */
export async function loadCaCertificates(entries: readonly string[]): Promise<string> {
  const out: string[] = [];
  for (const [i, entry] of entries.entries()) {
    const field = `network.caCertificates.${i}`;
    let text = entry;
    if (!entry.includes('-----BEGIN')) {
      if (!path.isAbsolute(entry)) throw new DsecError('INVALID_ARGUMENT', `${field}: neither PEM text nor an absolute path`, { field });
      try {
        text = await readFile(entry, 'utf8');
      } catch (err) {
        throw new DsecError('INVALID_ARGUMENT', `${field}: ${entry}: ${(err as Error).message}`, { field });
      }
    }
    const pems = text.match(PEM_RE) ?? [];
    if (pems.length === 0) throw new DsecError('INVALID_ARGUMENT', `${field}: no PEM certificate in it`, { field });
    for (const pem of pems) {
      try {
        const cert = new X509Certificate(pem);
        if (!cert.ca) throw new Error(`${cert.subject.replace(/\n/g, ', ')} is not a CA certificate`);
      } catch (err) {
        throw new DsecError('INVALID_ARGUMENT', `${field}: ${(err as Error).message}`, { field });
      }
      out.push(pem);
    }
  }
  return out.join('\n') + '\n';
}

/** The image's bundle with the operator's CAs appended once (a bundle that has them already gets them replaced). */
export function bundleWithOperatorCas(systemBundle: string | undefined, operatorPem: string): string {
  let base = systemBundle ?? '';
  const begin = base.indexOf(BEGIN_MARK);
  if (begin >= 0) {
    const end = base.indexOf(END_MARK, begin);
    base = base.slice(0, begin) + (end >= 0 ? base.slice(end + END_MARK.length).replace(/^\n/, '') : '');
  }
  if (base.length > 0 && !base.endsWith('\n')) base += '\n';
  return `${base}${BEGIN_MARK}\n${operatorPem}${END_MARK}\n`;
}

/** The variables that point Node, Python (requests, ssl), curl, git and npm at the bundle. */
export function trustEnv(): Record<string, string> {
  return {
    NODE_EXTRA_CA_CERTS: OPERATOR_CA_FILE,
    SSL_CERT_FILE: SYSTEM_CA_BUNDLE,
    REQUESTS_CA_BUNDLE: SYSTEM_CA_BUNDLE,
    CURL_CA_BUNDLE: SYSTEM_CA_BUNDLE,
    GIT_SSL_CAINFO: SYSTEM_CA_BUNDLE,
    npm_config_cafile: SYSTEM_CA_BUNDLE,
  };
}

/** Writes the operator's CAs into a sandbox's root: the system bundle (created when the image has none) and the file for Node. */
export async function installTrust(agent: SandboxAgent, operatorPem: string): Promise<void> {
  const current = await agent.readFile(SYSTEM_CA_BUNDLE, { maxBytes: MAX_BUNDLE_BYTES }).catch(() => undefined);
  await agent.mkdir(path.dirname(SYSTEM_CA_BUNDLE), { parents: true, mode: 0o755 });
  await agent.writeFile(SYSTEM_CA_BUNDLE, bundleWithOperatorCas(current?.toString('utf8'), operatorPem), { mode: 0o644 });
  await agent.writeFile(OPERATOR_CA_FILE, operatorPem, { mode: 0o644 });
}
