// sandbox.screen: the screen, mouse and keyboard of a VM (backend `vm`), in the action
// vocabulary computer-use agents speak; coordinates are screen pixels from the top left.
import { ScreenActionsSchema } from '@dsec/protocol';
import type { ScreenAction, ScreenInputResult, ScreenPoint } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import type { SandboxScope } from './scope.js';
import { validate } from './validate.js';

/** A screenshot: PNG bytes and the screen's size in pixels. */
export interface Screenshot {
  png: Buffer;
  width: number;
  height: number;
}

/** The screen of one sandbox (`sandbox.screen`). */
export class Screen {
  readonly #scope: SandboxScope;

  constructor(scope: SandboxScope) {
    this.#scope = scope;
  }

  /** A screenshot (PNG). A paused VM shows its screen as it was. */
  async capture(opts: CallOptions = {}): Promise<Screenshot> {
    const reply = await this.#scope.client.request({ method: 'GET', path: this.#scope.route('/screen'), accept: 'image/png' }, opts);
    return { png: reply.body, width: Number(reply.headers['x-screen-width']), height: Number(reply.headers['x-screen-height']) };
  }

  /** Performs actions in order (the whole list is checked first: a bad one sends nothing). */
  actions(actions: ScreenAction[], opts: CallOptions = {}): Promise<ScreenInputResult> {
    const body = { actions: validate(ScreenActionsSchema, actions, 'actions') };
    return this.#scope.client.json<ScreenInputResult>({ method: 'POST', path: this.#scope.route('/input'), body }, opts);
  }

  /** Left click at (x, y). */
  click(x: number, y: number, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'left_click', x, y }], opts);
  }

  doubleClick(x: number, y: number, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'double_click', x, y }], opts);
  }

  rightClick(x: number, y: number, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'right_click', x, y }], opts);
  }

  middleClick(x: number, y: number, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'middle_click', x, y }], opts);
  }

  /** Moves the pointer to (x, y). */
  move(x: number, y: number, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'mouse_move', x, y }], opts);
  }

  /** Presses the left button at the first point, moves through the others, releases at the last. */
  drag(path: ScreenPoint[], opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'drag', path }], opts);
  }

  /** Turns the wheel at (x, y): `dy` > 0 scrolls down, `dx` > 0 right, in wheel steps. */
  scroll(x: number, y: number, delta: { dx?: number; dy?: number }, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'scroll', x, y, dx: delta.dx ?? 0, dy: delta.dy ?? 0 }], opts);
  }

  /** Presses a key chord: `Return`, `ctrl+alt+t`, `shift+Tab` (xdotool names). */
  key(keys: string, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'key', keys }], opts);
  }

  /** Types text on a US keyboard layout (a character without a key is refused, naming its index). */
  type(text: string, opts?: CallOptions): Promise<ScreenInputResult> {
    return this.actions([{ action: 'type', text }], opts);
  }
}
