// The screen of a full VM's desktop: create to the desktop on the screen, screenshot latency, an
// input request's latency and the round trip of typed text (key press -> its glyph seen in a
// screenshot), pause with the memory in a file and resume from it, idle memory of a desktop;
// through the API, on a `backend: "vm"` sandbox of the `dsec image build --vm --desktop` image
// (cached machine-wide). Under TCG the figures say nothing about KVM. Run it by name
// (`--only vm-screen`): the boot is minutes of CPU under TCG.
import { access, constants, stat } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startPlatform } from '@dsec/apiserver';
import { countPixels, desktopShown, DESKTOP_XTERM as XTERM, focusXterm, isBlack, pollUntil } from '@dsec/edge';
import type { Platform } from '@dsec/apiserver';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

/** How long the desktop may take to show after create (TCG on a loaded machine). */
const DESKTOP_MS = 600_000;
/**
 * Pause between two screenshots while waiting for a glyph. A screendump holds QEMU's big lock
 * while it encodes the PNG (tens of ms under TCG); back to back they slow the guest that is to
 * draw what they look for.
 */
const POLL_MS = 50;

export const vmScreenScenario: Scenario = {
  name: 'vm-screen',
  title: 'VM desktops: desktop on screen, screenshots, typed text seen, pause to a file',
  method:
    'A platform with `vm: {}`; one sandbox of 1 cpu, 512 MiB, 2 GiB disk on the `dsec image build --vm --desktop` image (generic kernel + initramfs, virtio-blk root, Xorg + twm + xterm logged in as `user`). Create to the desktop on the screen (screenshots polled until the xterm\'s window is white and its prompt drawn and steady); screenshots one after another (QMP `screendump` to PNG, read back, sent as `image/png`); input requests of one key press (`POST /input` `{action: "key", keys: "shift"}`); typed text seen: the xterm given the focus (a click into it, then a command typed until it has run: keys sent before X took the click are lost), then one character at a time typed (`POST /input` `type`) and screenshots polled (50 ms apart) until its glyph\'s dark pixels appear; after 5 s idle the host memory charged to the VM\'s cgroup; pause with `memory: "file"` and resume from the file to the first exec answered, and the state file\'s size.',
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext): Promise<void> {
    const n = ctx.quick ? 10 : 40;
    const home = path.join(ctx.dir, 'vm-screen-home');
    progress('vm-screen: starting a platform with the vm backend');
    const platform: Platform = await startPlatform({ home, addr: '127.0.0.1:0', agentBinary: AGENT_BINARY, log: () => undefined, vm: {} });
    onCleanup('vm-screen platform', () => platform.shutdown());
    const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey!, requestTimeoutMs: 900_000 });
    try {
      progress('vm-screen: the desktop image (minutes when not cached)');
      await client.layers.buildVm({ name: 'vm-desktop', desktop: true }, { onProgress: (line) => progress(`desktop image: ${line}`) });
      const kvm = await access('/dev/kvm', constants.R_OK | constants.W_OK).then(
        () => true,
        () => false,
      );
      const accel = platform.edge.capacity().vm?.accel ?? 'tcg';
      ctx.note(
        `Accelerator: **${accel}**${kvm && accel === 'tcg' ? ' (/dev/kvm is present, the node config did not ask for it)' : ''}; under TCG these figures are not representative of KVM.`,
      );
      const system = `dsec vm desktop (${accel})`;
      const t0 = nowMs();
      const sb = await Sandbox.create({ backend: 'vm', image: { base: 'vm-desktop' }, resources: { cpu: 1, memoryMiB: 512, diskMiB: 2048 } }, { client });
      try {
        const agentReady = nowMs() - t0;
        ctx.record(latencyRow('vm-screen', 'create to agent ready (API)', system, summarize([agentReady])));
        const first = await pollUntil('the desktop on the screen', DESKTOP_MS, () => desktopShown(sb), 250);
        ctx.record(
          latencyRow('vm-screen', 'create to the desktop on the screen (xterm and its prompt drawn)', system, summarize([nowMs() - t0]), {
            note: `${first.width}x${first.height}`,
          }),
        );
        const shots: number[] = [];
        for (let i = 0; i < n; i++) {
          const t = nowMs();
          await sb.screen.capture();
          shots.push(nowMs() - t);
        }
        ctx.record(latencyRow('vm-screen', 'screenshot (PNG, API)', system, summarize(shots)));
        // Typed text seen: the xterm takes the focus (proved by a typed command having run), then
        // one character at a time, each timed from the request to its glyph in a screenshot.
        await focusXterm(sb, '/tmp/focus.txt', 180_000);
        let dark = countPixels(
          (
            await pollUntil('the screen steady after the focus command', 60_000, async () => {
              const a = await sb.screen.capture();
              await sleep(500);
              const b = await sb.screen.capture();
              return countPixels(a.png, XTERM, isBlack) === countPixels(b.png, XTERM, isBlack) ? b : undefined;
            })
          ).png,
          XTERM,
          isBlack,
        );
        const seen: number[] = [];
        for (let i = 0; i < (ctx.quick ? 5 : 20); i++) {
          const t = nowMs();
          await sb.screen.type('W');
          dark = await pollUntil(
            `typed character ${i + 1} drawn (dark pixels before: ${dark})`,
            60_000,
            async () => {
              const now = countPixels((await sb.screen.capture()).png, XTERM, isBlack);
              return now > dark + 10 ? now : undefined;
            },
            POLL_MS,
          );
          seen.push(nowMs() - t);
        }
        ctx.record(latencyRow('vm-screen', 'typed character to its glyph seen in a screenshot (API)', system, summarize(seen)));
        const inputs: number[] = [];
        for (let i = 0; i < n; i++) {
          const t = nowMs();
          await sb.screen.key('shift');
          inputs.push(nowMs() - t);
        }
        ctx.record(latencyRow('vm-screen', 'input request, one key press (API)', system, summarize(inputs)));
        await sb.screen.key('ctrl+u');
        await new Promise((r) => setTimeout(r, 5000));
        ctx.record({
          scenario: 'vm-screen',
          metric: 'idle host memory per desktop VM (cgroup)',
          system,
          unit: 'MiB',
          ...summarize([(await sb.stats()).memoryBytes / 1048576]),
        });
        const tp = nowMs();
        const paused = await sb.pause({ memory: 'file' });
        ctx.record(latencyRow('vm-screen', 'pause with memory to a file (API)', system, summarize([nowMs() - tp])));
        ctx.record({
          scenario: 'vm-screen',
          metric: 'host memory while paused to a file (cgroup)',
          system,
          unit: 'MiB',
          ...summarize([paused.memoryAfterBytes / 1048576]),
        });
        const state = await stat(path.join(platform.edge.home, 'vm', sb.id, 'memory.state'));
        ctx.record({
          scenario: 'vm-screen',
          metric: 'state file of the paused desktop (uncompressed)',
          system,
          unit: 'MiB',
          ...summarize([state.size / 1048576]),
        });
        const tr = nowMs();
        await sb.resume();
        await sb.exec('true');
        ctx.record(latencyRow('vm-screen', 'resume from the file to the first exec (API)', system, summarize([nowMs() - tr])));
      } finally {
        await sb.kill().catch(() => undefined);
      }
    } finally {
      await client.close();
    }
  },
};
