// What tests of the QEMU backends look for on the host.
import { readFile, readdir } from 'node:fs/promises';

/** Host pids of QEMU processes whose command line names `needle` (a sandbox id, a run dir). */
export async function qemuPids(needle: string): Promise<number[]> {
  const out: number[] = [];
  for (const e of await readdir('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    const cmd = await readFile(`/proc/${e}/cmdline`, 'utf8').catch(() => '');
    if (cmd.startsWith('qemu-system') && cmd.includes(needle)) out.push(Number(e));
  }
  return out;
}
