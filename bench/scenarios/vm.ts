// Full VMs (`backend: "vm"`): boot to the guest agent's first answer, exec round trip and idle
// host memory of a q35 + OVMF machine booting the `dsec image build --vm` image (cached
// machine-wide). Under TCG the figures say nothing about KVM (see docs/benchmarks.md). Run it by
// name (`--only vm`): each boot is tens of seconds of CPU under TCG.
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const RESOURCES = { cpu: 1, memoryMiB: 512, diskMiB: 2048 } as const;

/** Resident set of the QEMU process whose command line names the sandbox (KiB). */
async function qemuRssKiB(id: string): Promise<number | undefined> {
  for (const e of await readdir('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    const cmd = await readFile(`/proc/${e}/cmdline`, 'utf8').catch(() => '');
    if (!cmd.startsWith('qemu-system') || !cmd.includes(id)) continue;
    const m = /^VmRSS:\s+(\d+) kB/m.exec(await readFile(`/proc/${e}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  }
  return undefined;
}

export const vmScenario: Scenario = {
  name: 'vm',
  title: 'Full VMs: boot to agent ready, exec, idle memory',
  method:
    "A platform with `vm: {}`; the image is `dsec image build --vm` (Debian bookworm, systemd, qemu-guest-agent, chronus as a service; built once machine-wide, then cached). Per boot: a sandbox of 1 cpu, 512 MiB, 2 GiB disk; create (QEMU start, OVMF, systemd-boot, kernel, systemd up to chronus answering on virtio-serial) to the first `true` exec through the API; then `true` round trips on the first VM; then, after 5 s idle, the host memory charged to its cgroup (QEMU, the guest RAM it touched included) and QEMU's resident set.",
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext): Promise<void> {
    const quick = ctx.quick;
    const home = path.join(ctx.dir, 'vm-home');
    progress('vm: starting a platform with the vm backend');
    const platform: Platform = await startPlatform({ home, addr: '127.0.0.1:0', agentBinary: AGENT_BINARY, log: () => undefined, vm: {} });
    onCleanup('vm platform', () => platform.shutdown());
    const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey!, requestTimeoutMs: 900_000 });
    try {
      progress('vm: the VM image (minutes when not cached)');
      await client.layers.buildVm({ name: 'bench-vm' }, { onProgress: (line) => progress(`vm image: ${line}`) });
      const accel = platform.edge.capacity().vm?.accel ?? 'tcg';
      ctx.note(
        `Accelerator: **${accel}**.${accel === 'tcg' ? ' Under TCG every guest instruction (firmware, kernel, systemd) is translated: these figures are not representative of KVM.' : ''}`,
      );
      const firstExec: number[] = [];
      const roundTrip: number[] = [];
      const idleMiB: number[] = [];
      const rssMiB: number[] = [];
      const boots = quick ? 1 : 2;
      for (let i = 0; i < boots; i++) {
        progress(`vm: boot ${i + 1}/${boots}`);
        const t0 = nowMs();
        const sb = await Sandbox.create({ backend: 'vm', image: { base: 'bench-vm' }, resources: RESOURCES }, { client });
        try {
          await sb.exec('true');
          firstExec.push(nowMs() - t0);
          if (i === 0) {
            for (let j = 0; j < (quick ? 10 : 30); j++) {
              const t = nowMs();
              await sb.exec('true');
              roundTrip.push(nowMs() - t);
            }
          }
          await new Promise((r) => setTimeout(r, 5000));
          idleMiB.push((await sb.stats()).memoryBytes / 1048576);
          const rss = await qemuRssKiB(sb.id);
          if (rss !== undefined) rssMiB.push(rss / 1024);
        } finally {
          await sb.kill().catch(() => undefined);
        }
      }
      const system = `dsec vm (${accel})`;
      ctx.record(latencyRow('vm', 'create to first exec (API): boot to agent ready', system, summarize(firstExec)));
      ctx.record(latencyRow('vm', 'exec round trip `true` (API)', system, summarize(roundTrip)));
      ctx.record({ scenario: 'vm', metric: 'idle host memory per VM (cgroup)', system, unit: 'MiB', ...summarize(idleMiB) });
      if (rssMiB.length) ctx.record({ scenario: 'vm', metric: 'idle QEMU resident set', system, unit: 'MiB', ...summarize(rssMiB) });
    } finally {
      await client.close();
    }
  },
};
