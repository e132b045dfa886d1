// Lists that follow the event stream instead of polling: the sandboxes a key sees are read once
// (GET /v1/sandboxes), then kept current by the control plane's row events (sandbox.created,
// sandbox.state-changed, sandbox.deleted) on GET /v1/events, which carry the row as the list shows
// it. A dropped stream reconnects from the last event id, so nothing is missed.
import { useEffect, useRef, useState } from 'preact/hooks';
import { followEvents, get, withQuery } from './api.js';
import type { DsecEvent } from './api.js';
import { errorText } from './components.js';

/** A sandbox as GET /v1/sandboxes lists it (the fields the pages use). */
export interface SandboxRow {
  id: string;
  project: string;
  node: string;
  backend: string;
  state: string;
  labels: Record<string, string>;
  createdAt: string;
  resources: { cpu: number; memoryMiB: number; diskMiB: number };
}

/** The event kinds that follow a sandbox's row. */
export const ROW_EVENT_KINDS = ['sandbox.created', 'sandbox.state-changed', 'sandbox.deleted'];

/** Every sandbox the key sees (pages of 1,000). */
export async function allSandboxes(params: Record<string, string | string[] | undefined> = {}): Promise<SandboxRow[]> {
  const out: SandboxRow[] = [];
  let cursor: string | undefined;
  for (let i = 0; i < 20; i++) {
    const page = await get<{ items: SandboxRow[]; nextCursor: string | null }>(withQuery('/v1/sandboxes', { ...params, limit: 1000, cursor }));
    out.push(...page.items);
    if (!page.nextCursor) break;
    cursor = page.nextCursor;
  }
  return out;
}

/** Which sandboxes a list shows: every `key=value` label, and a state when given. */
export interface SandboxFilter {
  labels: string[];
  state?: string | undefined;
}

function matches(s: SandboxRow, f: SandboxFilter): boolean {
  if (f.state && s.state !== f.state) return false;
  return f.labels.every((kv) => {
    const i = kv.indexOf('=');
    return s.labels[kv.slice(0, i)] === kv.slice(i + 1);
  });
}

/**
 * The sandboxes that match `filter`, live: one read of the list, then the row events. `onEvent`
 * sees every row event as it comes (the overview counts creates with it).
 */
export function useLiveSandboxes(
  filter: SandboxFilter,
  onEvent?: (ev: DsecEvent) => void,
): { data: SandboxRow[] | undefined; error: string | undefined; live: boolean } {
  const [data, setData] = useState<SandboxRow[] | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const [live, setLive] = useState(false);
  const key = `${filter.labels.join(',')}|${filter.state ?? ''}`;
  const eventSeen = useRef(onEvent);
  eventSeen.current = onEvent;
  useEffect(() => {
    const ctl = new AbortController();
    const rows = new Map<string, SandboxRow>();
    let loaded = false;
    const early: DsecEvent[] = [];
    const publish = (): void => {
      if (!ctl.signal.aborted) setData([...rows.values()].sort((a, b) => (a.id < b.id ? -1 : 1)));
    };
    const put = (s: SandboxRow): void => {
      if (matches(s, filter)) rows.set(s.id, s);
      else rows.delete(s.id);
    };
    // A row the list does not hold yet (it entered the filter, or its event's data was cut).
    const fetchOne = (id: string): void => {
      get<SandboxRow>(`/v1/sandboxes/${encodeURIComponent(id)}`).then(
        (s) => {
          put(s);
          publish();
        },
        () => undefined,
      );
    };
    const apply = (ev: DsecEvent): void => {
      const id = ev.sandbox;
      if (!id) return;
      const d = (ev.data ?? {}) as { sandbox?: SandboxRow; state?: string };
      if (ev.kind === 'sandbox.deleted') rows.delete(id);
      else if (ev.kind === 'sandbox.created') {
        if (d.sandbox?.id === id) put(d.sandbox);
        else fetchOne(id);
      } else if (ev.kind === 'sandbox.state-changed' && d.state) {
        const known = rows.get(id);
        if (known) put({ ...known, state: d.state });
        else if (!filter.state || d.state === filter.state) fetchOne(id);
      }
    };
    let listed = false;
    const list = (): void => {
      if (listed) return;
      listed = true;
      const params = { label: filter.labels, state: filter.state || undefined };
      allSandboxes(params).then(
        (items) => {
          for (const s of items) rows.set(s.id, s);
          loaded = true;
          for (const ev of early.splice(0)) apply(ev);
          publish();
          setError(undefined);
        },
        (err: unknown) => setError(errorText(err)),
      );
    };
    // The list is read once the stream is open: nothing raised after the read is missed.
    followEvents(
      withQuery('', { kind: ROW_EVENT_KINDS.join(',') }).slice(1),
      (ev) => {
        eventSeen.current?.(ev);
        if (!loaded) early.push(ev);
        else {
          apply(ev);
          publish();
        }
      },
      ctl.signal,
      (up) => {
        setLive(up);
        if (up) list();
      },
    ).catch((err: unknown) => setError(errorText(err)));
    return () => ctl.abort();
  }, [key]);
  return { data, error, live };
}

/**
 * A counter that goes up (at most once per `afterMs`) after the sandbox row events the key sees:
 * a page whose figures change with sandboxes (a project's usage) reads them again on it instead
 * of polling.
 */
export function useRowEventTick(afterMs = 1000): number {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const ctl = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const bump = (): void => {
      timer ??= setTimeout(() => {
        timer = undefined;
        setTick((n) => n + 1);
      }, afterMs);
    };
    // A reconnect may have missed events: read again then too.
    followEvents(withQuery('', { kind: ROW_EVENT_KINDS.join(',') }).slice(1), bump, ctl.signal, (up) => (up ? bump() : undefined)).catch(() => undefined);
    return () => {
      ctl.abort();
      clearTimeout(timer);
    };
  }, [afterMs]);
  return tick;
}
