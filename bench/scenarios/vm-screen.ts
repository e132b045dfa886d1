// The screen of a full VM's desktop: create to the desktop on the screen, screenshot latency, an
// input request's latency and the round trip of typed text (key press -> its glyph seen in a
// screenshot), pause with the memory in a file and resume from it, idle memory of a desktop;
// through the API, on a `backend: "vm"` sandbox of the `dsec image build --vm --desktop` image
// (cached machine-wide). Under TCG the figures say nothing about KVM. Run it by name
// (`--only vm-screen`): the boot is minutes of CPU under TCG.
import { access, constants, stat } from 'node:fs/promises';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import { decodePng } from '@dsec/edge';
import type { Platform } from '@dsec/apiserver';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

/** The xterm's window (the image's xinitrc: `-geometry 100x32+16+16`, 6x13 `fixed`). */
const XTERM = { x: 16, y: 16, w: 600, h: 416 };
/** How long the desktop may take to show after create (TCG on a loaded machine). */
const DESKTOP_MS = 600_000;

/** Dark and white pixels inside the xterm of a screenshot. */
function darkInXterm(png: Buffer): { dark: number; white: number } {
  const { width, height, rgb } = decodePng(png);
  let dark = 0;
  let white = 0;
  for (let y = XTERM.y; y < Math.min(height, XTERM.y + XTERM.h); y++)
    for (let x = XTERM.x; x < Math.min(width, XTERM.x + XTERM.w); x++) {
      const i = (y * width + x) * 3;
      const [r, g, b] = [rgb[i]!, rgb[i + 1]!, rgb[i + 2]!];
      if (r < 16 && g < 16 && b < 16) dark++;
      else if (r > 240 && g > 240 && b > 240) white++;
    }
  return { dark, white };
}

export const vmScreenScenario: Scenario = {
  name: 'vm-screen',
  title: 'VM desktops: desktop on screen, screenshots, typed text seen, pause to a file',
  method:
    'A platform with `vm: {}`; one sandbox of 1 cpu, 512 MiB, 2 GiB disk on the `dsec image build --vm --desktop` image (generic kernel + initramfs, virtio-blk root, Xorg + twm + xterm logged in as `user`). Create to the desktop on the screen (screenshots polled until the xterm\'s window is white); screenshots one after another (QMP `screendump` to PNG, read back, sent as `image/png`); input requests of one key press (`POST /input` `{action: "key", keys: "shift"}`); typed text seen: one character typed into the xterm (`POST /input` `type`), screenshots polled until its glyph\'s dark pixels appear; after 5 s idle the host memory charged to the VM\'s cgroup; pause with `memory: "file"` and resume from the file to the first exec answered, and the state file\'s size.',
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
        let first: Awaited<ReturnType<typeof sb.screen.capture>> | undefined;
        for (const deadline = nowMs() + DESKTOP_MS; ;) {
          // The window white and its prompt drawn (dark glyphs, the same in two screenshots 1 s apart).
          const shot = await sb.screen.capture();
          const seen = darkInXterm(shot.png);
          if (seen.white > (XTERM.w - 16) * (XTERM.h - 60) * 0.9 && seen.dark >= 100) {
            await new Promise((r) => setTimeout(r, 1000));
            const again = await sb.screen.capture();
            if (darkInXterm(again.png).dark === seen.dark) {
              first = again;
              break;
            }
          }
          if (nowMs() > deadline) throw new Error(`the desktop did not show within ${DESKTOP_MS} ms`);
          await new Promise((r) => setTimeout(r, 250));
        }
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
        // Typed text seen: the pointer into the xterm (focus follows it), then one character at a time.
        // X takes the click (and the focus) some time after the request under TCG; xterm's cursor,
        // hollow without the focus, is a filled block with it: nothing is timed before it shows.
        await sb.screen.click(XTERM.x + XTERM.w / 2, XTERM.y + XTERM.h / 2);
        const idle = darkInXterm(first.png).dark;
        let dark = idle;
        for (const deadline = nowMs() + 120_000; dark <= idle + 30; dark = darkInXterm((await sb.screen.capture()).png).dark)
          if (nowMs() > deadline) throw new Error('the xterm did not take the focus within 120 s');
        const seen: number[] = [];
        for (let i = 0; i < (ctx.quick ? 5 : 20); i++) {
          const t = nowMs();
          await sb.screen.type('W');
          for (const deadline = nowMs() + 60_000; ;) {
            const now = darkInXterm((await sb.screen.capture()).png).dark;
            if (now > dark + 10) {
              dark = now;
              break;
            }
            if (nowMs() > deadline) throw new Error(`a typed character was not drawn within 60 s (dark pixels ${dark}, before the click ${idle})`);
          }
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
