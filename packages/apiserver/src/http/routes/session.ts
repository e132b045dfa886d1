// /v1/whoami (the calling key: id, project, role) and /v1/ws-tickets (a single-use ticket for one
// WebSocket, ws-tickets.ts): what a browser client (the dashboard, docs/dashboard.md) needs.
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { requestHeader } from '../validate.js';

/** The calling key, and WebSocket tickets. */
export function sessionRoutes({ services: { iam } }: RouterDeps) {
  return (
    router()
      .get('/whoami', (c) => {
        const p = c.get('principal');
        return c.json({ keyId: p.keyId, project: p.projectId, role: p.role, tenant: p.tenantId });
      })
      // The middleware has authenticated the header: the ticket stands for that key (checked
      // again, revoked or not, at redemption on whichever replica the WebSocket reaches).
      .post('/ws-tickets', async (c) => c.json(await iam.issueWsTicket(c.get('principal'), requestHeader(c, 'authorization')), 201))
  );
}
