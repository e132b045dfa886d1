// Screens of VMs: screenshots, input and the live VNC connection (GET /v1/sandboxes/{id}/screen,
// POST /v1/sandboxes/{id}/input, /v1/sandboxes/{id}/vnc over WebSocket), routed to the node.
import type { ProcessStream, ScreenCapture, ScreenInputRequest, ScreenInputResult } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import type { TenantSlots } from '../tenant-limits.js';
import type { LifecycleService } from './lifecycle.js';

/** Screens, mice and keyboards of sandboxes whose backend has them. */
export class ScreenService {
  constructor(
    private readonly lifecycle: LifecycleService,
    private readonly slots: TenantSlots,
  ) {}

  /**
   * A screenshot (viewer and above). Looking is not activity and a paused VM shows its screen
   * as it was: a dashboard watching a VM never keeps it awake.
   */
  async capture(p: Principal, id: string, signal?: AbortSignal): Promise<ScreenCapture> {
    const { edge, row } = await this.lifecycle.route(p, id, 'viewer', { paused: 'allow' });
    return edge.screen.capture(row.id, { signal });
  }

  /** Mouse and keyboard actions (member and above); a paused VM is resumed first when its lease allows. */
  async input(p: Principal, id: string, req: ScreenInputRequest, signal?: AbortSignal): Promise<ScreenInputResult> {
    const { edge, row } = await this.lifecycle.route(p, id, 'member');
    return edge.screen.input(row.id, req.actions, { signal });
  }

  /**
   * The VNC connection of a live view (member and above: a viewer's pointer and keys reach the
   * VM). Watching is not activity: a paused VM is shown as it is (not resumed), and only the
   * viewer's input counts (the WebSocket route touches it). The connection holds one of its
   * tenant's and node's command slots until `release` is called.
   */
  async connect(p: Principal, id: string): Promise<{ sandboxId: string; stream: ProcessStream; release: () => void }> {
    const { edge, row } = await this.lifecycle.route(p, id, 'member', { paused: 'allow' });
    const release = this.slots.acquire('exec', p.tenantId, row.node);
    try {
      return { sandboxId: row.id, stream: await edge.screen.connect(row.id), release };
    } catch (err) {
      release();
      throw err;
    }
  }
}
