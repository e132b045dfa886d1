// /v1/sandboxes/{id}/screen (a PNG) and /v1/sandboxes/{id}/input (computer-use actions); the
// live view (/v1/sandboxes/{id}/vnc) is a WebSocket, served in http/ws.ts.
import { ScreenInputRequestSchema } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { jsonBody, requestSignal } from '../validate.js';

/** Screens of VMs. */
export function screenRoutes({ services: { screens } }: RouterDeps) {
  return router()
    .get('/sandboxes/:id/screen', async (c) => {
      const shot = await screens.capture(c.get('principal'), c.req.param('id'), requestSignal(c));
      return c.body(new Uint8Array(shot.png), 200, {
        'content-type': 'image/png',
        'cache-control': 'no-store',
        'x-screen-width': String(shot.width),
        'x-screen-height': String(shot.height),
      });
    })
    .post('/sandboxes/:id/input', jsonBody(ScreenInputRequestSchema), async (c) =>
      c.json(await screens.input(c.get('principal'), c.req.param('id'), c.get('body'), requestSignal(c))),
    );
}
