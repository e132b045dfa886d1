// The screen of a full VM: create to the first screenshot, screenshot latency and the round trip
// of an input request, through the API, on a `backend: "vm"` sandbox booting the
// `dsec image build --vm` image (cached machine-wide). Under TCG the figures say nothing about
// KVM. Run it by name (`--only vm-screen`): the boot is tens of seconds of CPU under TCG.
import { access, constants } from 'node:fs/promises';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

export const vmScreenScenario: Scenario = {
  name: 'vm-screen',
  title: 'VM screens: first screenshot, screenshot latency, input round trip',
  method:
    'A platform with `vm: {}`; one sandbox of 1 cpu, 512 MiB, 2 GiB disk on the `dsec image build --vm` image. Create to the first screenshot (`GET /screen` answering a PNG) through the SDK; then screenshots one after another (QMP `screendump` to PNG in the VM run directory, read back, sent as `image/png`) and input requests of one key press (`POST /input` `{action: "key", keys: "shift"}`: the screen size read from a screendump, then QMP `input-send-event` down and up and the 8 ms pacing).',
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext): Promise<void> {
    const n = ctx.quick ? 10 : 40;
    const home = path.join(ctx.dir, 'vm-screen-home');
    progress('vm-screen: starting a platform with the vm backend');
    const platform: Platform = await startPlatform({
      home,
      addr: '127.0.0.1:0',
      agentBinary: AGENT_BINARY,
      log: (line) => progress(`vm-screen platform: ${line}`),
      vm: {},
    });
    onCleanup('vm-screen platform', () => platform.shutdown());
    const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey!, requestTimeoutMs: 600_000 });
    try {
      await client.layers.buildVm({ name: 'vm-screen' }, { onProgress: (line) => progress(`vm image: ${line}`) });
      const kvm = await access('/dev/kvm', constants.R_OK | constants.W_OK).then(
        () => true,
        () => false,
      );
      ctx.note(
        `${kvm ? '/dev/kvm is present (the VM may still run under TCG: see the vm scenario)' : 'No /dev/kvm: the VM runs under **TCG**'}; under TCG these figures are not representative of KVM.`,
      );
      const t0 = nowMs();
      const sb = await Sandbox.create({ backend: 'vm', image: { base: 'vm-screen' }, resources: { cpu: 1, memoryMiB: 512, diskMiB: 2048 } }, { client });
      try {
        const first = await sb.screen.capture();
        ctx.record(
          latencyRow('vm-screen', 'create to first screenshot (API)', 'dsec vm', summarize([nowMs() - t0]), { note: `${first.width}x${first.height}` }),
        );
        const shots: number[] = [];
        for (let i = 0; i < n; i++) {
          const t = nowMs();
          await sb.screen.capture();
          shots.push(nowMs() - t);
        }
        ctx.record(latencyRow('vm-screen', 'screenshot (PNG, API)', 'dsec vm', summarize(shots)));
        const inputs: number[] = [];
        for (let i = 0; i < n; i++) {
          const t = nowMs();
          await sb.screen.key('shift');
          inputs.push(nowMs() - t);
        }
        ctx.record(latencyRow('vm-screen', 'input request, one key press (API)', 'dsec vm', summarize(inputs)));
      } finally {
        await sb.kill().catch(() => undefined);
      }
    } finally {
      await client.close();
    }
  },
};
