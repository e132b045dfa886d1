// /v1/events (a page, or a live SSE stream), /v1/audit (a page, followed, or ndjson export), /v1/rules.
import { CreateRuleRequestSchema, ListAuditQuerySchema, ListEventsQuerySchema } from '@dsec/protocol';
import type { WatchService } from '../../watch.js';
import { router } from '../env.js';
import { wantsFollow } from '../streams.js';
import type { LiveStreams } from '../streams.js';
import { jsonBody, query, requestHeader, requestSignal } from '../validate.js';

/** Events, the audit trail and run-time rules. */
export function watchRoutes(watch: WatchService, streams: LiveStreams) {
  return router()
    .get('/events', query(ListEventsQuerySchema, []), async (c) => {
      const p = c.get('principal');
      if ((requestHeader(c, 'accept') ?? '').includes('text/event-stream')) {
        return streams.open(p, requestSignal(c), () => watch.streamEvents(p, c.get('query'), requestHeader(c, 'last-event-id'), requestSignal(c)));
      }
      return c.json(await watch.listEvents(p, c.get('query')));
    })
    .get('/audit', query(ListAuditQuerySchema, []), async (c) => {
      const p = c.get('principal');
      if (wantsFollow(requestHeader(c, 'accept'))) return streams.follow(p, requestSignal(c), () => watch.listAudit(p, c.get('query')));
      if ((requestHeader(c, 'accept') ?? '').includes('application/x-ndjson')) return watch.exportAudit(p, c.get('query'));
      return c.json(await watch.listAudit(p, c.get('query')));
    })
    .post('/rules', jsonBody(CreateRuleRequestSchema), async (c) => c.json(await watch.createRule(c.get('principal'), c.get('body')), 201))
    .get('/rules', async (c) => c.json({ items: await watch.listRules(c.get('principal')), nextCursor: null }))
    .delete('/rules/:id', async (c) => {
      await watch.deleteRule(c.get('principal'), c.req.param('id'));
      return c.body(null, 204);
    });
}
