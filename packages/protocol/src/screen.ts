// A VM's screen and input (`GET /v1/sandboxes/{id}/screen`, `POST /v1/sandboxes/{id}/input`):
// the action vocabulary computer-use agents speak (Anthropic computer use, OpenAI CUA), with
// coordinates in screen pixels. The screen's size is known only on the node, so coordinates are
// checked against it there; everything else is checked here.
import { z } from 'zod';
import { parseKeyChord, textChords } from './screen-keys.js';

/** Most actions in one input request. */
export const MAX_SCREEN_ACTIONS = 200;
/** Most characters of one `type` action (and of all `type` actions of a request together). */
export const MAX_TYPED_CHARS = 4096;
/** Longest `wait` of one action (ms); the waits of one request together are bounded by {@link MAX_INPUT_WAIT_MS}. */
export const MAX_WAIT_MS = 10_000;
/** Longest total of the `wait` actions of one request (ms). */
export const MAX_INPUT_WAIT_MS = 30_000;
/** Most points of a `drag` path. */
export const MAX_DRAG_POINTS = 256;
/** Largest coordinate accepted before the node compares it with the screen (a screen is never wider). */
const MAX_COORDINATE = 16_384;

const coord = z.number().int().min(0).max(MAX_COORDINATE);
const PointSchema = z.strictObject({ x: coord, y: coord });
/** A point on the screen, in pixels from its top left corner. */
export type ScreenPoint = z.infer<typeof PointSchema>;

const keys = z
  .string()
  .min(1)
  .max(128)
  .superRefine((v, ctx) => {
    try {
      parseKeyChord(v);
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: (err as Error).message });
    }
  });

const text = z
  .string()
  .max(MAX_TYPED_CHARS)
  .superRefine((v, ctx) => {
    const r = textChords(v);
    if ('badIndex' in r) ctx.addIssue({ code: 'custom', message: `character ${r.badIndex} (${JSON.stringify(r.char)}) has no key on a US keyboard layout` });
  });

/** One input action. */
export const ScreenActionSchema = z.discriminatedUnion('action', [
  z.strictObject({ action: z.literal('mouse_move'), x: coord, y: coord }),
  z.strictObject({ action: z.literal('left_click'), x: coord, y: coord }),
  z.strictObject({ action: z.literal('right_click'), x: coord, y: coord }),
  z.strictObject({ action: z.literal('middle_click'), x: coord, y: coord }),
  z.strictObject({ action: z.literal('double_click'), x: coord, y: coord }),
  z.strictObject({ action: z.literal('triple_click'), x: coord, y: coord }),
  /** Presses the left button at `from`, moves to `to`, releases it there. */
  z.strictObject({ action: z.literal('left_click_drag'), from: PointSchema, to: PointSchema }),
  /** Presses the left button at the first point, moves through the others, releases at the last. */
  z.strictObject({ action: z.literal('drag'), path: z.array(PointSchema).min(2).max(MAX_DRAG_POINTS) }),
  /** Moves to (x, y) and turns the wheel: `dy` > 0 down, `dx` > 0 right, in wheel steps. */
  z.strictObject({
    action: z.literal('scroll'),
    x: coord,
    y: coord,
    dx: z.number().int().min(-50).max(50).default(0),
    dy: z.number().int().min(-50).max(50).default(0),
  }),
  /** Presses a key chord (`ctrl+alt+t`, `Return`, `shift+Tab`) and releases it. */
  z.strictObject({ action: z.literal('key'), keys }),
  /** Types text on a US layout, one key press per character. */
  z.strictObject({ action: z.literal('type'), text }),
  z.strictObject({ action: z.literal('wait'), ms: z.number().int().min(0).max(MAX_WAIT_MS) }),
]);
/** One input action. */
export type ScreenAction = z.infer<typeof ScreenActionSchema>;

/** The actions of one request, bounded in number, typed characters and waiting. */
export const ScreenActionsSchema = z
  .array(ScreenActionSchema)
  .min(1)
  .max(MAX_SCREEN_ACTIONS)
  .superRefine((actions, ctx) => {
    let typed = 0;
    let waited = 0;
    actions.forEach((a, i) => {
      if (a.action === 'type') typed += a.text.length;
      if (a.action === 'wait') waited += a.ms;
      if (a.action === 'type' && typed > MAX_TYPED_CHARS)
        ctx.addIssue({ code: 'custom', path: [i, 'text'], message: `more than ${MAX_TYPED_CHARS} characters typed in one request` });
      if (a.action === 'wait' && waited > MAX_INPUT_WAIT_MS)
        ctx.addIssue({ code: 'custom', path: [i, 'ms'], message: `more than ${MAX_INPUT_WAIT_MS} ms of waits in one request` });
    });
  });

/** `POST /v1/sandboxes/{id}/input`. */
export const ScreenInputRequestSchema = z.strictObject({ actions: ScreenActionsSchema });
/** `POST /v1/sandboxes/{id}/input`. */
export type ScreenInputRequest = z.infer<typeof ScreenInputRequestSchema>;

/** What an input request did. */
export const ScreenInputResultSchema = z.strictObject({
  /** Actions performed (all of them: a request is checked whole before the first is sent). */
  performed: z.number().int(),
  /** The screen's size the coordinates were taken against. */
  width: z.number().int(),
  height: z.number().int(),
});
/** What an input request did. */
export type ScreenInputResult = z.infer<typeof ScreenInputResultSchema>;

/** A screenshot: PNG bytes and the screen's size. */
export interface ScreenCapture {
  png: Uint8Array;
  width: number;
  height: number;
}

/** The points an action puts the pointer at, with the field that names each coordinate pair. */
export function actionPoints(a: ScreenAction): Array<{ field: string; point: ScreenPoint }> {
  switch (a.action) {
    case 'left_click_drag':
      return [
        { field: 'from', point: a.from },
        { field: 'to', point: a.to },
      ];
    case 'drag':
      return a.path.map((point, i) => ({ field: `path.${i}`, point }));
    case 'key':
    case 'type':
    case 'wait':
      return [];
    default:
      return [{ field: '', point: { x: a.x, y: a.y } }];
  }
}
