// The pages other than a sandbox's own (sandbox.tsx): overview, sandboxes, projects and usage,
// keys, pools, layers, events and audit. The overview and the sandboxes follow the event stream
// (live.ts) and the node usage stream; keys, pools, layers and the audit trail are followed
// answers (useFollow: the API pushes each change); nothing polls.
import { useEffect, useRef, useState } from 'preact/hooks';
import { ActionButton, Chart, ErrorLine, Meter, Section, Table, bytes, errorText, time, useCan, useFollow, usePoll } from './components.js';
import { api, followEvents, followNdjson, get, ndjson, request, withQuery } from './api.js';
import type { DsecEvent } from './api.js';
import { useLiveSandboxes, useRowEventTick } from './live.js';

/** A node in a line of the node usage stream (GET /v1/nodes, ndjson). */
interface NodeUsage {
  name: string;
  healthy: boolean;
  backends: string[];
  capacity: { cpu: number; memoryMiB: number; sandboxes: number };
  /** Null (like `allocated`, `used`, `machine`) for a key outside the root project: the operator's figures. */
  allocatable: { cpu: number; memoryMiB: number } | null;
  allocated: { cpu: number; memoryMiB: number; sandboxes: number } | null;
  used: { cpu: number; memoryMiB: number; sandboxes: number } | null;
  machine: { cpuPercent: number; memoryUsedBytes: number; memoryTotalBytes: number } | null;
}

const HISTORY = 60;

/** Interval of the node usage stream (ms). */
const NODE_USAGE_MS = 2000;

/**
 * Overview: nodes (allocated and used), sandboxes by state and backend, creates per second. The
 * counts follow the sandbox events; the nodes' allocation and use come on the node usage stream
 * (GET /v1/nodes as ndjson): nothing here polls.
 */
export function Overview() {
  const [series, setSeries] = useState<number[][]>([[], []]);
  const creates = useRef(0);
  const sandboxes = useLiveSandboxes({ labels: [] }, (ev) => {
    if (ev.kind === 'sandbox.created') creates.current++;
  });
  const nodes = useNodeUsage();
  // Creates per second, counted from the events (a local clock, no request).
  useEffect(() => {
    const timer = setInterval(() => {
      const now = Date.now() / 1000;
      const n = creates.current;
      creates.current = 0;
      setSeries((s) => [[...s[0]!, now].slice(-HISTORY), [...s[1]!, n].slice(-HISTORY)]);
    }, 1000);
    return () => clearInterval(timer);
  }, []);
  const data = { nodes: nodes.data, sandboxes: sandboxes.data };
  const error = sandboxes.error ?? nodes.error;
  const byState: Record<string, number> = {};
  const byBackend: Record<string, number> = {};
  for (const s of data?.sandboxes ?? []) {
    byState[s.state] = (byState[s.state] ?? 0) + 1;
    byBackend[s.backend] = (byBackend[s.backend] ?? 0) + 1;
  }
  return (
    <div>
      <ErrorLine error={error} />
      <Section title="Nodes">
        <Table
          testid="nodes"
          head={[
            'node',
            'healthy',
            'backends',
            'CPU allocated',
            'memory allocated',
            'sandboxes',
            "sandboxes' CPU used",
            'machine CPU used',
            'machine memory used',
          ]}
          rows={(data?.nodes ?? []).map((n) => {
            const u = n.machine;
            const a = n.allocated;
            const t = n.allocatable;
            return [
              n.name,
              n.healthy ? 'yes' : 'no',
              n.backends.join(', '),
              a && t ? <Meter used={a.cpu} total={t.cpu} label={`${a.cpu} / ${t.cpu} cores`} /> : `${n.capacity.cpu} cores`,
              a && t ? <Meter used={a.memoryMiB} total={t.memoryMiB} label={`${a.memoryMiB} / ${t.memoryMiB} MiB`} /> : `${n.capacity.memoryMiB} MiB`,
              a ? `${a.sandboxes} / ${n.capacity.sandboxes}` : `- / ${n.capacity.sandboxes}`,
              n.used ? <Meter used={n.used.cpu} total={n.capacity.cpu} label={`${n.used.cpu.toFixed(2)} cores`} /> : '-',
              u ? <Meter used={u.cpuPercent} total={100} label={`${u.cpuPercent.toFixed(0)}%`} /> : '-',
              u ? <Meter used={u.memoryUsedBytes} total={u.memoryTotalBytes} label={`${bytes(u.memoryUsedBytes)} / ${bytes(u.memoryTotalBytes)}`} /> : '-',
            ];
          })}
        />
      </Section>
      <div class="row">
        <Section title="Sandboxes by state">
          <Table testid="by-state" head={['state', 'count']} rows={Object.entries(byState).map(([k, v]) => [k, String(v)])} />
        </Section>
        <Section title="Sandboxes by backend">
          <Table head={['backend', 'count']} rows={Object.entries(byBackend).map(([k, v]) => [k, String(v)])} />
        </Section>
        <Section title="Creates per second">
          <Chart title="creates/s" series={['creates/s']} points={series} unit="" />
        </Section>
      </div>
    </div>
  );
}

/** The nodes' allocation and use, pushed by the node usage stream (one line per interval). */
function useNodeUsage(): { data: NodeUsage[] | undefined; error: string | undefined } {
  const [data, setData] = useState<NodeUsage[] | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  useEffect(() => {
    const ctl = new AbortController();
    followNdjson<{ at: string; items: NodeUsage[] }>(
      withQuery('/v1/nodes', { intervalMs: NODE_USAGE_MS }),
      (sample) => {
        setData(sample.items);
        setError(undefined);
      },
      ctl.signal,
    ).catch((err: unknown) => setError(errorText(err)));
    return () => ctl.abort();
  }, []);
  return { data, error };
}

/** Sandboxes: filters by label, state and project; bulk pause, resume and delete. */
export function Sandboxes() {
  const [label, setLabel] = useState('');
  const [state, setState] = useState('');
  const [project, setProject] = useState('');
  const [selected, setSelected] = useState<Set<string>>(new Set());
  const [bulkError, setBulkError] = useState<string | undefined>(undefined);
  const canAct = useCan('member');
  const labels = label
    .split(',')
    .map((s) => s.trim())
    .filter((s) => /^[^=]+=.*$/.test(s));
  const { data, error } = useLiveSandboxes({ labels, state });
  const rows = (data ?? []).filter((s) => !project || s.project === project);
  const projects = [...new Set((data ?? []).map((s) => s.project))].sort();
  const bulk = async (what: 'pause' | 'resume' | 'delete'): Promise<void> => {
    setBulkError(undefined);
    const ids = [...selected];
    const results = await Promise.allSettled(
      ids.map((id) =>
        what === 'delete' ? api('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`) : api('POST', `/v1/sandboxes/${encodeURIComponent(id)}/${what}`, {}),
      ),
    );
    const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [`${ids[i]}: ${errorText(r.reason)}`] : []));
    if (failed.length) setBulkError(failed.join('; '));
    setSelected(new Set());
  };
  const toggle = (id: string): void => {
    const next = new Set(selected);
    if (next.has(id)) next.delete(id);
    else next.add(id);
    setSelected(next);
  };
  return (
    <div>
      <div class="filters">
        <label>
          labels <input data-testid="filter-label" placeholder="k=v,k2=v2" value={label} onInput={(e) => setLabel(e.currentTarget.value)} />
        </label>
        <label>
          state{' '}
          <select data-testid="filter-state" value={state} onChange={(e) => setState(e.currentTarget.value)}>
            <option value="">any</option>
            {['pending', 'creating', 'running', 'paused', 'stopped', 'failed', 'lost'].map((s) => (
              <option value={s}>{s}</option>
            ))}
          </select>
        </label>
        <label>
          project{' '}
          <select value={project} onChange={(e) => setProject(e.currentTarget.value)}>
            <option value="">any</option>
            {projects.map((p) => (
              <option value={p}>{p}</option>
            ))}
          </select>
        </label>
        {canAct ? (
          <span class="bulk">
            <ActionButton testid="bulk-pause" label={`pause ${selected.size}`} disabled={selected.size === 0} run={() => bulk('pause')} />
            <ActionButton testid="bulk-resume" label={`resume ${selected.size}`} disabled={selected.size === 0} run={() => bulk('resume')} />
            <ActionButton testid="bulk-delete" danger label={`delete ${selected.size}`} disabled={selected.size === 0} run={() => bulk('delete')} />
          </span>
        ) : null}
      </div>
      <ErrorLine error={error ?? bulkError} />
      {canAct ? <CreateSandboxes /> : null}
      <Table
        testid="sandboxes"
        head={[...(canAct ? [''] : []), 'id', 'state', 'backend', 'project', 'node', 'labels', 'resources', 'created']}
        rows={rows.map((s) => [
          ...(canAct ? [<input type="checkbox" aria-label={`select ${s.id}`} checked={selected.has(s.id)} onChange={() => toggle(s.id)} />] : []),
          <a href={`#/sandbox/${encodeURIComponent(s.id)}`}>{s.id}</a>,
          <span class={`state state-${s.state}`}>{s.state}</span>,
          s.backend,
          s.project,
          s.node,
          <span class="labels">
            {Object.entries(s.labels).map(([k, v]) => (
              <span class="label">{`${k}=${v}`}</span>
            ))}
          </span>,
          `${s.resources.cpu} CPU, ${s.resources.memoryMiB} MiB`,
          time(s.createdAt),
        ])}
      />
    </div>
  );
}

/** Creates `count` sandboxes in one batch (POST /v1/sandboxes:batch), showing each item as it finishes. */
function CreateSandboxes() {
  const [base, setBase] = useState('busybox');
  const [count, setCount] = useState('1');
  const [labels, setLabels] = useState('');
  const [memory, setMemory] = useState('64');
  const [progress, setProgress] = useState<{ created: number; failed: number; total: number; errors: string[]; done: boolean } | undefined>(undefined);
  return (
    <div class="filters create">
      <input data-testid="create-base" placeholder="image base" value={base} onInput={(e) => setBase(e.currentTarget.value)} />
      <label>
        count <input data-testid="create-count" type="number" min="1" max="10000" value={count} onInput={(e) => setCount(e.currentTarget.value)} />
      </label>
      <label>
        MiB <input type="number" min="16" value={memory} onInput={(e) => setMemory(e.currentTarget.value)} />
      </label>
      <input data-testid="create-labels" placeholder="labels k=v,k2=v2" value={labels} onInput={(e) => setLabels(e.currentTarget.value)} />
      <ActionButton
        testid="create"
        label="create"
        run={async () => {
          const total = Number(count);
          const labelMap: Record<string, string> = {};
          for (const kv of labels.split(',')) {
            const i = kv.indexOf('=');
            if (i > 0) labelMap[kv.slice(0, i).trim()] = kv.slice(i + 1).trim();
          }
          const state = { created: 0, failed: 0, total, errors: [] as string[], done: false };
          setProgress({ ...state });
          await ndjson<{ type: string; sandbox?: unknown; error?: { code: string; message: string } }>(
            'POST',
            '/v1/sandboxes:batch',
            { spec: { image: { base }, resources: { memoryMiB: Number(memory) }, labels: labelMap }, count: total },
            (ev) => {
              if (ev.type === 'item' && ev.sandbox) state.created++;
              else if (ev.type === 'item' || ev.type === 'error') {
                state.failed += ev.type === 'item' ? 1 : 0;
                if (ev.error && state.errors.length < 5) state.errors.push(`${ev.error.code}: ${ev.error.message}`);
              } else if (ev.type === 'summary') state.done = true;
              setProgress({ ...state, errors: [...state.errors] });
            },
          );
        }}
      />
      {progress ? (
        <span data-testid="create-progress" class="muted">
          {`${progress.created} created, ${progress.failed} failed of ${progress.total}${progress.done ? ' (done)' : '…'}`}
          {progress.errors.length ? ` ${progress.errors.join('; ')}` : ''}
        </span>
      ) : null}
    </div>
  );
}

interface ProjectRow {
  id: string;
  name: string;
  parent: string | null;
  quota: { sandboxes: number; cpu: number; memoryMiB: number };
  usage: { sandboxes: number; cpu: number; memoryMiB: number };
  createdAt: string;
}

/** Projects with their quotas and usage: read again after sandbox row events (usage moves with them), not polled. */
export function Projects() {
  const changed = useRowEventTick();
  const { data, error } = usePoll(() => get<{ items: ProjectRow[] }>('/v1/projects'), 0, [changed]);
  return (
    <Section title="Projects, quotas and usage">
      <ErrorLine error={error} />
      <Table
        testid="projects"
        head={['project', 'name', 'parent', 'sandboxes', 'CPU', 'memory']}
        rows={(data?.items ?? []).map((p) => [
          p.id,
          p.name,
          p.parent ?? '-',
          <Meter used={p.usage.sandboxes} total={p.quota.sandboxes} label={`${p.usage.sandboxes} / ${p.quota.sandboxes}`} />,
          <Meter used={p.usage.cpu} total={p.quota.cpu} label={`${p.usage.cpu} / ${p.quota.cpu}`} />,
          <Meter used={p.usage.memoryMiB} total={p.quota.memoryMiB} label={`${p.usage.memoryMiB} / ${p.quota.memoryMiB} MiB`} />,
        ])}
      />
    </Section>
  );
}

interface KeyRow {
  id: string;
  name: string;
  role: string;
  project: string;
  createdAt: string;
  revokedAt: string | null;
}

/** API keys (admins): list (followed), create (the secret shown once), revoke. */
export function Keys() {
  const { data, error, live } = useFollow<{ items: KeyRow[] }>('/v1/keys');
  const [name, setName] = useState('');
  const [role, setRole] = useState('viewer');
  const [secret, setSecret] = useState<string | undefined>(undefined);
  return (
    <Section title="API keys">
      <ErrorLine error={error} />
      <div class="filters">
        <input placeholder="name" value={name} onInput={(e) => setName(e.currentTarget.value)} />
        <select value={role} onChange={(e) => setRole(e.currentTarget.value)}>
          <option value="viewer">viewer</option>
          <option value="member">member</option>
          <option value="admin">admin</option>
        </select>
        <ActionButton
          label="create key"
          run={async () => {
            const k = await api<{ key: string }>('POST', '/v1/keys', { name, role });
            setSecret(k.key);
          }}
        />
      </div>
      {secret ? (
        <p class="secret">
          New key (shown once): <code>{secret}</code>
        </p>
      ) : null}
      <LiveLine live={live} testid="keys-live" />
      <Table
        testid="keys"
        head={['id', 'name', 'role', 'project', 'created', 'revoked', '']}
        rows={(data?.items ?? []).map((k) => [
          k.id,
          k.name,
          k.role,
          k.project,
          time(k.createdAt),
          time(k.revokedAt),
          k.revokedAt ? '' : <ActionButton danger label="revoke" run={() => api('DELETE', `/v1/keys/${encodeURIComponent(k.id)}`)} />,
        ])}
      />
    </Section>
  );
}

interface PoolRow {
  name: string;
  project: string;
  size: number;
  ready: number;
  creating: number;
  idleTimeoutMs: number;
}

/** Warm pools (followed: sizes and members as they change). */
export function Pools() {
  const { data, error, live } = useFollow<{ items: PoolRow[] }>('/v1/pools');
  return (
    <Section title="Warm pools">
      <ErrorLine error={error} />
      <LiveLine live={live} testid="pools-live" />
      <Table
        testid="pools"
        head={['pool', 'project', 'size', 'ready', 'creating', 'idle timeout']}
        rows={(data?.items ?? []).map((p) => [p.name, p.project, String(p.size), String(p.ready), String(p.creating), `${p.idleTimeoutMs / 1000} s`])}
      />
    </Section>
  );
}

interface LayerRow {
  digest: string;
  kind: string;
  names: string[];
  project: string;
  contentBytes: number;
  files: number;
  createdAt: string;
}

/** Layers and images (followed), with a Debian image build that shows its progress. */
export function Layers() {
  const { data, error, live } = useFollow<{ items: LayerRow[] }>('/v1/layers');
  const canBuild = useCan('member');
  const [name, setName] = useState('');
  const [packages, setPackages] = useState('');
  const [progress, setProgress] = useState<string[]>([]);
  return (
    <div>
      <Section title="Layers and images">
        <ErrorLine error={error} />
        <LiveLine live={live} testid="layers-live" />
        <Table
          testid="layers"
          head={['names', 'kind', 'project', 'size', 'files', 'digest', 'created']}
          rows={(data?.items ?? []).map((l) => [
            l.names.join(', '),
            l.kind,
            l.project,
            bytes(l.contentBytes),
            String(l.files),
            l.digest.slice(0, 19),
            time(l.createdAt),
          ])}
        />
      </Section>
      {canBuild ? (
        <Section title="Build a Debian image">
          <div class="filters">
            <input placeholder="name:tag" value={name} onInput={(e) => setName(e.currentTarget.value)} />
            <input placeholder="packages (space separated)" value={packages} onInput={(e) => setPackages(e.currentTarget.value)} />
            <ActionButton
              label="build"
              run={async () => {
                setProgress([]);
                await ndjson<{ type: string; message?: string; layer?: LayerRow; error?: { message: string } }>(
                  'POST',
                  '/v1/layers/debian',
                  { kind: 'base', ...(name ? { name } : {}), packages: packages.split(/\s+/).filter(Boolean) },
                  (ev) => setProgress((p) => [...p, ev.type === 'layer' ? `done: ${ev.layer?.digest ?? ''}` : (ev.message ?? ev.error?.message ?? ev.type)]),
                );
              }}
            />
          </div>
          <pre class="log">{progress.join('\n')}</pre>
        </Section>
      ) : null}
    </div>
  );
}

/** Whether a followed list's stream is up. */
export function LiveLine({ live, testid }: { live: boolean; testid: string }) {
  return (
    <p class="muted" data-testid={testid}>
      {live ? 'live' : 'connecting…'}
    </p>
  );
}

/** A live list of events (stream over fetch) with filters; used here and on a sandbox's page. */
export function EventList({
  sandbox,
  kind,
  severity,
  testid,
}: {
  sandbox?: string | undefined;
  kind?: string | undefined;
  severity?: string | undefined;
  testid?: string | undefined;
}) {
  const [events, setEvents] = useState<DsecEvent[]>([]);
  const [live, setLive] = useState(false);
  const [error, setError] = useState<string | undefined>(undefined);
  useEffect(() => {
    setEvents([]);
    const ctl = new AbortController();
    const q = new URLSearchParams();
    if (sandbox) q.set('sandbox', sandbox);
    if (kind) q.set('kind', kind);
    if (severity) q.set('severity', severity);
    // The stream replays stored events from `since` (the last hour), then follows.
    q.set('since', new Date(Date.now() - 3600_000).toISOString());
    followEvents(q.toString(), (ev) => setEvents((list) => [ev, ...list].slice(0, 500)), ctl.signal, setLive).catch((err: unknown) => setError(errorText(err)));
    return () => ctl.abort();
  }, [sandbox, kind, severity]);
  return (
    <div>
      <p class="muted" data-testid={testid ? `${testid}-live` : undefined}>
        {live ? 'live' : 'connecting…'}
      </p>
      <ErrorLine error={error} />
      <Table
        testid={testid}
        head={['at', 'kind', 'severity', 'sandbox', 'message']}
        rows={events.map((e) => [time(e.at), e.kind, <span class={`sev sev-${e.severity}`}>{e.severity}</span>, e.sandbox ?? '-', e.message])}
      />
    </div>
  );
}

interface AuditRow {
  at: string;
  key: string | null;
  project: string | null;
  method: string;
  route: string;
  sandbox: string | null;
  status: number;
  durationMs: number;
  command: string | null;
  exitCode: number | null;
  count?: number;
}

/** Events (live) and the audit trail, each with filters. */
export function Events() {
  const [kind, setKind] = useState('');
  const [severity, setSeverity] = useState('');
  const [sandbox, setSandbox] = useState('');
  const [auditSandbox, setAuditSandbox] = useState('');
  const [auditKey, setAuditKey] = useState('');
  const [writesOnly, setWritesOnly] = useState(true);
  // Followed: a write shows as soon as it is audited.
  const audit = useFollow<{ items: AuditRow[] }>(withQuery('/v1/audit', { limit: 500, sandbox: auditSandbox || undefined, key: auditKey || undefined }));
  // The dashboard's own reads are audited too: by default only calls that change something are shown.
  const auditRows = (audit.data?.items ?? []).filter((a) => !writesOnly || a.method !== 'GET');
  return (
    <div>
      <Section title="Events (live)">
        <div class="filters">
          <input data-testid="events-kind" placeholder="kinds, comma separated" value={kind} onChange={(e) => setKind(e.currentTarget.value)} />
          <select value={severity} onChange={(e) => setSeverity(e.currentTarget.value)}>
            <option value="">any severity</option>
            <option value="info">info and up</option>
            <option value="warning">warning and up</option>
            <option value="critical">critical</option>
          </select>
          <input placeholder="sandbox id" value={sandbox} onChange={(e) => setSandbox(e.currentTarget.value)} />
        </div>
        <EventList testid="events" kind={kind} severity={severity} sandbox={sandbox} />
      </Section>
      <Section title="Audit">
        <div class="filters">
          <input placeholder="sandbox id" value={auditSandbox} onChange={(e) => setAuditSandbox(e.currentTarget.value)} />
          <input placeholder="key id" value={auditKey} onChange={(e) => setAuditKey(e.currentTarget.value)} />
          <label>
            <input type="checkbox" checked={writesOnly} onChange={(e) => setWritesOnly(e.currentTarget.checked)} /> changes only (no GET)
          </label>
        </div>
        <ErrorLine error={audit.error} />
        <LiveLine live={audit.live} testid="audit-live" />
        <Table
          testid="audit"
          head={['at', 'key', 'method', 'route', 'sandbox', 'status', 'ms', 'command', 'exit']}
          rows={auditRows.map((a) => [
            time(a.at),
            a.key ?? '-',
            a.method,
            a.route + (a.count ? ` (x${a.count})` : ''),
            a.sandbox ?? '-',
            String(a.status),
            a.durationMs.toFixed(0),
            a.command ?? '',
            a.exitCode == null ? '' : String(a.exitCode),
          ])}
        />
      </Section>
    </div>
  );
}

/** Downloads a response body as a file (the key stays in the header, never in a link). */
export async function download(path: string, filename: string): Promise<void> {
  const res = await request('GET', path);
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
