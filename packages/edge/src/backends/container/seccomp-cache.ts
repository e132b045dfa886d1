// Compiled seccomp filters, kept per edge process so that crun compiles each profile once.
// crun turns the OCI seccomp section into BPF with libseccomp on every create (~2 ms of CPU, a
// tenth of a create's) and writes the result into the container's state directory
// (`<root>/<id>/seccomp.bpf`). The first create of a profile lets crun compile it; edge then
// reads that file and hands the same program to later creates of the same profile through crun's
// `run.oci.seccomp_bpf_data` annotation. crun still takes the filter's flags (LOG) from the
// seccomp section, which stays in the config. The key is the section's exact JSON: the same
// crun (edge runs one sealed copy of it for its lifetime) on the same architecture makes the same
// program from it. The state directory is root's (0700) and written before the sandbox's first
// process runs; nothing in a sandbox can reach it.
import { readFile } from 'node:fs/promises';
import path from 'node:path';

/** The annotation through which crun takes a compiled filter (base64) instead of compiling one. */
export const SECCOMP_BPF_ANNOTATION = 'run.oci.seccomp_bpf_data';
/** Profiles kept (distinct specs: default, ptrace allowed, extra denied system calls). */
const MAX_PROFILES = 64;
/** A classic BPF program has at most 4,096 instructions of 8 bytes. */
const MAX_BPF_BYTES = 4096 * 8;

export class SeccompCache {
  private readonly programs = new Map<string, string>();

  constructor(private readonly crunRoot: string) {}

  /**
   * Adds the compiled program of `config`'s seccomp section to its annotations when one is
   * known; returns the section's key (undefined without a section).
   */
  apply(config: Record<string, unknown>): string | undefined {
    const seccomp = (config['linux'] as Record<string, unknown> | undefined)?.['seccomp'];
    if (!seccomp) return undefined;
    const key = JSON.stringify(seccomp);
    const program = this.programs.get(key);
    if (program) {
      config['annotations'] = { ...(config['annotations'] as Record<string, string> | undefined), [SECCOMP_BPF_ANNOTATION]: program };
    }
    return key;
  }

  /** Keeps the program crun compiled for container `id` (created from the section `key`), unless it is known. */
  async learn(key: string, id: string): Promise<void> {
    if (this.programs.has(key)) return;
    const bpf = await readFile(path.join(this.crunRoot, id, 'seccomp.bpf')).catch(() => undefined);
    if (!bpf || bpf.length === 0 || bpf.length % 8 !== 0 || bpf.length > MAX_BPF_BYTES) return;
    if (this.programs.size >= MAX_PROFILES) this.programs.delete(this.programs.keys().next().value as string);
    this.programs.set(key, bpf.toString('base64'));
  }
}
