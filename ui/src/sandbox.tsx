// One sandbox: spec, lease and owner, live charts, processes and their output, a terminal (xterm.js
// over the exec WebSocket with a PTY), files, the network policy and egress log, events, the
// trajectory with replay, and the diff.
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { ActionButton, Chart, ErrorLine, Section, Table, bytes, errorText, time, useCan, useFollow, usePoll } from './components.js';
import { api, followEvents, followNdjson, fromBase64, get, ndjson, openSocket, request, toBase64, withQuery } from './api.js';
import { ROW_EVENT_KINDS } from './live.js';
import { EventList, LiveLine, download } from './pages.js';
import { RfbClient, keysymOf } from './rfb.js';

interface Sandbox {
  id: string;
  project: string;
  node: string;
  backend: string;
  state: string;
  image: unknown;
  resources: { cpu: number; memoryMiB: number; diskMiB: number; pids: number };
  labels: Record<string, string>;
  createdAt: string;
  expiresAt: string | null;
  lease: Record<string, unknown>;
  owner: string | null;
  lastActiveAt: string | null;
  pausedAt: string | null;
  pauseReason: string | null;
}

interface Stats {
  cpuUsageMs: number;
  memoryBytes: number;
  memoryLimitBytes: number;
  diskUsedBytes: number;
  diskLimitBytes: number;
  pids: number;
}

const TABS = ['overview', 'screen', 'terminal', 'processes', 'files', 'network', 'events', 'trajectory', 'diff'] as const;
type Tab = (typeof TABS)[number];

/** The page of sandbox `id`, on tab `tab`. */
export function SandboxPage({ id, tab }: { id: string; tab: string }) {
  const current: Tab = (TABS as readonly string[]).includes(tab) ? (tab as Tab) : 'overview';
  // Read again when one of its row events (a state change, from anywhere) arrives: no polling.
  const [changed, setChanged] = useState(0);
  useEffect(() => {
    const ctl = new AbortController();
    const q = withQuery('', { sandbox: id, kind: ROW_EVENT_KINDS.join(',') }).slice(1);
    followEvents(q, () => setChanged((n) => n + 1), ctl.signal).catch(() => undefined);
    return () => ctl.abort();
  }, [id]);
  const sb = usePoll(() => get<Sandbox>(`/v1/sandboxes/${encodeURIComponent(id)}`), 0, [id, changed]);
  const canAct = useCan('member');
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  const s = sb.data;
  return (
    <div>
      <header class="sandbox-head">
        <h1>{id}</h1>
        {s ? (
          <span data-testid="sandbox-state" class={`state state-${s.state}`}>
            {s.state}
          </span>
        ) : null}
        {canAct && s ? (
          <span class="actions">
            {s.state === 'paused' ? (
              <ActionButton testid="resume" label="resume" run={() => api('POST', `${base}/resume`, {}).then(sb.reload)} />
            ) : (
              <ActionButton testid="pause" label="pause" run={() => api('POST', `${base}/pause`).then(sb.reload)} />
            )}
            <ActionButton
              testid="delete"
              danger
              label="delete"
              run={async () => {
                if (!confirm(`Delete sandbox ${id}?`)) return;
                await api('DELETE', base);
                location.hash = '#/sandboxes';
              }}
            />
          </span>
        ) : null}
      </header>
      <ErrorLine error={sb.error} />
      <nav class="tabs">
        {TABS.filter((t) => (t !== 'terminal' || canAct) && (t !== 'screen' || s?.backend === 'vm')).map((t) => (
          <a class={t === current ? 'active' : ''} href={`#/sandbox/${encodeURIComponent(id)}/${t}`} data-testid={`tab-${t}`}>
            {t}
          </a>
        ))}
      </nav>
      {current === 'overview' && s ? <OverviewTab sb={s} base={base} /> : null}
      {current === 'screen' && s?.backend === 'vm' ? canAct ? <ScreenTab base={base} /> : <ScreenshotView base={base} /> : null}
      {current === 'terminal' && canAct ? <TerminalTab base={base} /> : null}
      {current === 'processes' ? <ProcessesTab base={base} /> : null}
      {current === 'files' ? <FilesTab base={base} /> : null}
      {current === 'network' ? <NetworkTab base={base} /> : null}
      {current === 'events' ? <EventList testid="sandbox-events" sandbox={id} /> : null}
      {current === 'trajectory' ? <TrajectoryTab base={base} /> : null}
      {current === 'diff' ? <DiffTab base={base} /> : null}
    </div>
  );
}

const POINTS = 90;
/** Interval of a sandbox's stats stream (ms). */
const STATS_MS = 2000;

function OverviewTab({ sb, base }: { sb: Sandbox; base: string }) {
  const [cpu, setCpu] = useState<number[][]>([[], []]);
  const [mem, setMem] = useState<number[][]>([[], [], []]);
  const [disk, setDisk] = useState<number[][]>([[], [], []]);
  const last = useRef<{ at: number; cpuMs: number } | null>(null);
  const [statsError, setStatsError] = useState<string | undefined>(undefined);
  const [now, setNow] = useState<Stats | undefined>(undefined);
  // Pushed by the sandbox's stats stream (GET .../stats as ndjson), one sample per interval.
  useEffect(() => {
    const ctl = new AbortController();
    const onSample = (sample: { at: string; stats?: Stats; error?: { code: string; message: string } }): void => {
      if (sample.error) {
        setStatsError(`${sample.error.code}: ${sample.error.message}`);
        return;
      }
      const st = sample.stats;
      if (!st) return;
      setStatsError(undefined);
      setNow(st);
      const at = Date.parse(sample.at) / 1000;
      const push = (arr: number[][], ...vals: number[]): number[][] => [
        [...arr[0]!, at].slice(-POINTS),
        ...vals.map((v, i) => [...arr[i + 1]!, v].slice(-POINTS)),
      ];
      const p = last.current;
      if (p && at > p.at) setCpu((a) => push(a, Math.max(0, (st.cpuUsageMs - p.cpuMs) / ((at - p.at) * 1000)) * 100));
      last.current = { at, cpuMs: st.cpuUsageMs };
      setMem((a) => push(a, st.memoryBytes, st.memoryLimitBytes));
      setDisk((a) => push(a, st.diskUsedBytes, st.diskLimitBytes));
    };
    followNdjson(withQuery(`${base}/stats`, { intervalMs: STATS_MS }), onSample, ctl.signal).catch((err: unknown) => setStatsError(errorText(err)));
    return () => ctl.abort();
  }, [base]);
  return (
    <div>
      <div class="row">
        <Chart title="CPU" series={['CPU %']} points={cpu} unit="%" />
        <Chart title="memory" series={['used', 'limit']} points={mem} unit="bytes" />
        <Chart title="disk" series={['used', 'limit']} points={disk} unit="bytes" />
      </div>
      <ErrorLine error={statsError} />
      {now ? <p class="muted" data-testid="stats-now">{`now: memory ${bytes(now.memoryBytes)}, pids ${now.pids}, disk ${bytes(now.diskUsedBytes)}`}</p> : null}
      <div class="row">
        <Section title="Spec">
          <dl class="kv" data-testid="spec">
            <dt>project</dt>
            <dd>{sb.project}</dd>
            <dt>node</dt>
            <dd>{sb.node}</dd>
            <dt>backend</dt>
            <dd>{sb.backend}</dd>
            <dt>resources</dt>
            <dd>{`${sb.resources.cpu} CPU, ${sb.resources.memoryMiB} MiB, ${sb.resources.diskMiB} MiB disk, ${sb.resources.pids} pids`}</dd>
            <dt>image</dt>
            <dd>
              <code>{JSON.stringify(sb.image)}</code>
            </dd>
            <dt>labels</dt>
            <dd class="labels" data-testid="sandbox-labels">
              {Object.entries(sb.labels).map(([k, v]) => (
                <span class="label">{`${k}=${v}`}</span>
              ))}
            </dd>
            <dt>created</dt>
            <dd>{time(sb.createdAt)}</dd>
            <dt>expires</dt>
            <dd>{time(sb.expiresAt)}</dd>
          </dl>
        </Section>
        <Section title="Lease and owner">
          <dl class="kv">
            {Object.entries(sb.lease).map(([k, v]) => [<dt>{k}</dt>, <dd>{String(v)}</dd>])}
            <dt>owner</dt>
            <dd>{sb.owner ?? '-'}</dd>
            <dt>last active</dt>
            <dd>{time(sb.lastActiveAt)}</dd>
            <dt>paused</dt>
            <dd>{sb.pausedAt ? `${time(sb.pausedAt)} (${sb.pauseReason ?? ''})` : '-'}</dd>
          </dl>
        </Section>
      </div>
    </div>
  );
}

/**
 * A VM's screen live: the RFB client over the VNC WebSocket (opened with a single-use ticket),
 * with the pointer and keyboard of the canvas sent to the VM.
 */
function ScreenTab({ base }: { base: string }) {
  const el = useRef<HTMLCanvasElement>(null);
  const [status, setStatus] = useState('connecting…');
  const [size, setSize] = useState('');
  useEffect(() => {
    const canvas = el.current;
    if (!canvas) return;
    let rfb: RfbClient | undefined;
    let closed = false;
    void openSocket(`${base}/vnc`)
      .then((socket) => {
        rfb = new RfbClient(socket, canvas, { onSize: (w, h) => setSize(`${w}×${h}`), onStatus: setStatus });
        if (closed) rfb.close();
      })
      .catch((err: unknown) => setStatus(`error: ${errorText(err)}`));
    // Canvas pixels from a mouse event (the canvas may be shown scaled).
    const at = (e: MouseEvent): [number, number] => {
      const r = canvas.getBoundingClientRect();
      return [((e.clientX - r.left) * canvas.width) / r.width, ((e.clientY - r.top) * canvas.height) / r.height];
    };
    // DOM buttons (0 left, 1 middle, 2 right) as RFB's mask bits (1 left, 2 middle, 4 right).
    const mask = (e: MouseEvent): number => (e.buttons & 1) | ((e.buttons & 4) >> 1) | ((e.buttons & 2) << 1);
    const onMouse = (e: MouseEvent): void => {
      e.preventDefault();
      if (e.type === 'mousedown') canvas.focus();
      rfb?.pointer(...at(e), mask(e));
    };
    const onWheel = (e: WheelEvent): void => {
      e.preventDefault();
      rfb?.wheel(...at(e), e.deltaY);
    };
    const onKey = (e: KeyboardEvent): void => {
      const sym = keysymOf(e.key);
      if (sym === undefined) return;
      e.preventDefault();
      rfb?.key(sym, e.type === 'keydown');
    };
    const noMenu = (e: Event): void => e.preventDefault();
    for (const t of ['mousedown', 'mouseup', 'mousemove'] as const) canvas.addEventListener(t, onMouse);
    canvas.addEventListener('wheel', onWheel, { passive: false });
    canvas.addEventListener('keydown', onKey);
    canvas.addEventListener('keyup', onKey);
    canvas.addEventListener('contextmenu', noMenu);
    return () => {
      closed = true;
      rfb?.close();
      for (const t of ['mousedown', 'mouseup', 'mousemove'] as const) canvas.removeEventListener(t, onMouse);
      canvas.removeEventListener('wheel', onWheel);
      canvas.removeEventListener('keydown', onKey);
      canvas.removeEventListener('keyup', onKey);
      canvas.removeEventListener('contextmenu', noMenu);
    };
  }, [base]);
  return (
    <div>
      <p class="muted" data-testid="screen-status">
        {status} {size}
      </p>
      <canvas class="vm-screen" ref={el} tabIndex={0} data-testid="screen" />
    </div>
  );
}

/** A viewer's look at a VM's screen: a screenshot every 2 s (the live view takes input, so it needs a member). */
function ScreenshotView({ base }: { base: string }) {
  const [url, setUrl] = useState<string>();
  const [error, setError] = useState<string>();
  useEffect(() => {
    let current: string | undefined;
    let stop = false;
    const tick = async (): Promise<void> => {
      try {
        const blob = await (await request('GET', `${base}/screen`, undefined, { accept: 'image/png' })).blob();
        if (stop) return;
        const next = URL.createObjectURL(blob);
        setUrl(next);
        if (current) URL.revokeObjectURL(current);
        current = next;
        setError(undefined);
      } catch (err) {
        setError(errorText(err));
      }
    };
    void tick();
    const timer = setInterval(() => void tick(), 2000);
    return () => {
      stop = true;
      clearInterval(timer);
      if (current) URL.revokeObjectURL(current);
    };
  }, [base]);
  return (
    <div>
      <ErrorLine error={error} />
      {url ? <img class="vm-screen" src={url} alt="screen of the VM" data-testid="screenshot" /> : null}
    </div>
  );
}

/** An interactive shell: xterm.js over the exec WebSocket (PTY), opened with a single-use ticket. */
function TerminalTab({ base }: { base: string }) {
  const el = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('connecting…');
  useEffect(() => {
    if (!el.current) return;
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el.current);
    fit.fit();
    const enc = new TextEncoder();
    let ws: WebSocket | undefined;
    let closed = false;
    void openSocket(`${base}/exec/ws`)
      .then((socket) => {
        ws = socket;
        if (closed) socket.close();
        socket.onopen = () => {
          setStatus('connected');
          socket.send(JSON.stringify({ argv: ['/bin/sh', '-i'], env: { TERM: 'xterm-256color' }, pty: { rows: term.rows, cols: term.cols } }));
          term.focus();
        };
        socket.onmessage = (m) => {
          const ev = JSON.parse(String(m.data)) as { type: string; data?: string; exitCode?: number | null; error?: { message: string } };
          if (ev.type === 'output' && ev.data) term.write(fromBase64(ev.data));
          else if (ev.type === 'exit') setStatus(`exited (${ev.exitCode ?? 'signal'})`);
          else if (ev.type === 'error') setStatus(`error: ${ev.error?.message ?? ''}`);
        };
        socket.onclose = () => setStatus((s) => (s === 'connected' ? 'closed' : s));
        socket.onerror = () => setStatus('connection failed');
      })
      .catch((err: unknown) => setStatus(`error: ${errorText(err)}`));
    const input = term.onData((d) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'stdin', data: toBase64(enc.encode(d)) }));
    });
    const resize = term.onResize(({ rows, cols }) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows, cols }));
    });
    const onWindow = (): void => fit.fit();
    window.addEventListener('resize', onWindow);
    return () => {
      closed = true;
      window.removeEventListener('resize', onWindow);
      input.dispose();
      resize.dispose();
      ws?.close();
      term.dispose();
    };
  }, [base]);
  return (
    <div>
      <p class="muted" data-testid="terminal-status">
        {status}
      </p>
      <div class="terminal" ref={el} data-testid="terminal" />
    </div>
  );
}

interface Proc {
  pid: number;
  osPid: number;
  argv: string[];
  state: string;
  stdoutBytes: number;
  stderrBytes: number;
  exit?: { exitCode: number | null; signal: string | null };
}

function ProcessesTab({ base }: { base: string }) {
  const { data, error } = useFollow<{ items: Proc[] }>(`${base}/processes`);
  const [shown, setShown] = useState<number | undefined>(undefined);
  return (
    <div>
      <ErrorLine error={error} />
      <Table
        testid="processes"
        head={['pid', 'os pid', 'command', 'state', 'stdout', 'stderr', 'exit', '']}
        rows={(data?.items ?? []).map((p) => [
          String(p.pid),
          String(p.osPid),
          p.argv.join(' '),
          p.state,
          bytes(p.stdoutBytes),
          bytes(p.stderrBytes),
          p.exit ? String(p.exit.exitCode ?? p.exit.signal) : '',
          <button onClick={() => setShown(p.pid)}>output</button>,
        ])}
      />
      {shown !== undefined ? <ProcessOutput key={shown} base={base} pid={shown} /> : null}
    </div>
  );
}

/** A process's output from offset 0 on, as it comes (gaps shown). */
function ProcessOutput({ base, pid }: { base: string; pid: number }) {
  const [text, setText] = useState('');
  const [error, setError] = useState<string | undefined>(undefined);
  useEffect(() => {
    const ctl = new AbortController();
    const dec = new TextDecoder();
    void ndjson<{ type: string; stream?: string; data?: string; bytes?: number; exitCode?: number | null }>(
      'GET',
      withQuery(`${base}/processes/${pid}/output`, { from: 0, fromStderr: 0 }),
      undefined,
      (ev) => {
        if (ev.type === 'output' && ev.data) setText((t) => t + dec.decode(fromBase64(ev.data!), { stream: true }));
        else if (ev.type === 'gap') setText((t) => `${t}\n[${ev.bytes ?? 0} bytes no longer kept]\n`);
        else if (ev.type === 'exit') setText((t) => `${t}\n[exit ${ev.exitCode ?? 'by signal'}]`);
      },
      ctl.signal,
    ).catch((err: unknown) => {
      if (!ctl.signal.aborted) setError(errorText(err));
    });
    return () => ctl.abort();
  }, [base, pid]);
  return (
    <Section title={`Output of process ${pid}`}>
      <ErrorLine error={error} />
      <pre class="log" data-testid="process-output">
        {text}
      </pre>
    </Section>
  );
}

interface Entry {
  name: string;
  type: string;
  mode: number;
  size: number;
  mtimeMs: number;
  linkTarget?: string;
}

function join(dir: string, name: string): string {
  return dir === '/' ? `/${name}` : `${dir}/${name}`;
}

function FilesTab({ base }: { base: string }) {
  const [dir, setDir] = useState('/tmp');
  const [pathInput, setPathInput] = useState('/tmp');
  const canWrite = useCan('member');
  const { data, error, reload } = usePoll(() => get<{ items: Entry[] }>(withQuery(`${base}/files/list`, { path: dir })), 0, [base, dir]);
  const fileInput = useRef<HTMLInputElement>(null);
  const [uploadError, setUploadError] = useState<string | undefined>(undefined);
  const go = (d: string): void => {
    setDir(d);
    setPathInput(d);
  };
  const parent = dir === '/' ? '/' : dir.replace(/\/[^/]*$/, '') || '/';
  return (
    <div>
      <div class="filters">
        <input
          data-testid="files-path"
          value={pathInput}
          onInput={(e) => setPathInput(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key === 'Enter') setDir(pathInput);
          }}
        />
        <button onClick={() => setDir(pathInput)}>open</button>
        <button onClick={() => go(parent)}>up</button>
        <button onClick={reload}>refresh</button>
        {canWrite ? (
          <label class="upload">
            upload{' '}
            <input
              ref={fileInput}
              type="file"
              multiple
              data-testid="upload"
              onChange={async (e) => {
                setUploadError(undefined);
                try {
                  for (const f of Array.from(e.currentTarget.files ?? [])) {
                    await request('PUT', withQuery(`${base}/files`, { path: join(dir, f.name) }), f, { 'content-type': 'application/octet-stream' });
                  }
                } catch (err) {
                  setUploadError(errorText(err));
                }
                if (fileInput.current) fileInput.current.value = '';
                reload();
              }}
            />
          </label>
        ) : null}
      </div>
      <ErrorLine error={error ?? uploadError} />
      <Table
        testid="files"
        head={['name', 'type', 'size', 'mode', 'modified', '']}
        rows={(data?.items ?? []).map((f) => [
          f.type === 'dir' ? (
            <button class="link" onClick={() => go(join(dir, f.name))}>
              {f.name}
            </button>
          ) : (
            <span class="file-name">{f.name + (f.linkTarget ? ` -> ${f.linkTarget}` : '')}</span>
          ),
          f.type,
          bytes(f.size),
          (f.mode & 0o7777).toString(8),
          new Date(f.mtimeMs).toLocaleString(),
          f.type === 'file' ? (
            <ActionButton
              testid={`download-${f.name}`}
              label="download"
              run={() => download(withQuery(`${base}/files`, { path: join(dir, f.name) }), f.name)}
            />
          ) : (
            ''
          ),
        ])}
      />
    </div>
  );
}

interface NetworkInfo {
  policy: unknown;
  address?: string;
  stats: Record<string, number>;
}

interface EgressEntry {
  at: string;
  via: string;
  host: string;
  port: number;
  verdict: string;
  rule?: string;
  reason?: string;
}

function NetworkTab({ base }: { base: string }) {
  const net = usePoll(() => get<NetworkInfo>(`${base}/network`), 0, [base]);
  const log = useFollow<{ items: EgressEntry[] }>(withQuery(`${base}/network/log`, { limit: 200 }));
  const canEdit = useCan('member');
  const [text, setText] = useState<string | undefined>(undefined);
  const [saved, setSaved] = useState('');
  const shown = text ?? (net.data ? JSON.stringify(net.data.policy, null, 2) : '');
  return (
    <div class="row">
      <Section title="Network policy">
        <ErrorLine error={net.error} />
        <textarea data-testid="policy" rows={14} cols={60} readOnly={!canEdit} value={shown} onInput={(e) => setText(e.currentTarget.value)} />
        {canEdit ? (
          <div>
            <ActionButton
              testid="apply-policy"
              label="apply"
              run={async () => {
                let policy: unknown;
                try {
                  policy = JSON.parse(shown);
                } catch {
                  throw new Error('the policy is not valid JSON');
                }
                const res = await api<NetworkInfo>('PUT', `${base}/network`, policy);
                setText(undefined);
                setSaved(`applied at ${new Date().toLocaleTimeString()}`);
                net.reload();
                return res;
              }}
            />
            <span class="muted" data-testid="policy-saved">
              {saved}
            </span>
          </div>
        ) : null}
        {net.data ? (
          <p class="muted">{`address ${net.data.address ?? '-'}; ${Object.entries(net.data.stats)
            .map(([k, v]) => `${k} ${v}`)
            .join(', ')}`}</p>
        ) : null}
      </Section>
      <Section title="Egress log">
        <ErrorLine error={log.error} />
        <LiveLine live={log.live} testid="egress-live" />
        <Table
          testid="egress"
          head={['at', 'via', 'host', 'port', 'verdict', 'rule / reason']}
          rows={(log.data?.items ?? [])
            .slice()
            .reverse()
            .map((e) => [time(e.at), e.via, e.host, String(e.port), e.verdict, e.rule ?? e.reason ?? ''])}
        />
      </Section>
    </div>
  );
}

interface Step {
  seq: number;
  kind: string;
  startedAt: string;
  durationMs: number | null;
  replayable: boolean;
  via?: string;
  command?: { cmd?: string; argv?: string[] };
  exit?: { exitCode: number | null; signal: string | null } | null;
  path?: string;
  from?: string;
  to?: string;
}

function stepText(s: Step): string {
  if (s.kind === 'exec') return s.command?.cmd ?? s.command?.argv?.join(' ') ?? '';
  if (s.kind === 'rename') return `${s.from ?? ''} -> ${s.to ?? ''}`;
  return s.path ?? '';
}

function TrajectoryTab({ base }: { base: string }) {
  const canReplay = useCan('member');
  const { data, error, live } = useFollow<{ items: Step[]; steps: number; truncated: boolean }>(
    withQuery(`${base}/trajectory`, { content: false, limit: 1000 }),
  );
  const [progress, setProgress] = useState<string[]>([]);
  const [replayed, setReplayed] = useState<string | undefined>(undefined);
  return (
    <div>
      <ErrorLine error={error} />
      <Section
        title={`Trajectory (${data?.steps ?? 0} steps${data?.truncated ? ', truncated' : ''})`}
        actions={
          canReplay ? (
            <ActionButton
              testid="replay"
              label="replay"
              run={async () => {
                setProgress([]);
                await ndjson<{
                  type: string;
                  sandbox?: { id: string };
                  step?: { seq: number; verdict: string };
                  result?: { summary: unknown };
                  error?: { message: string };
                }>('POST', `${base}/replay`, {}, (ev) => {
                  if (ev.type === 'sandbox' && ev.sandbox) setReplayed(ev.sandbox.id);
                  const line =
                    ev.type === 'step'
                      ? `step ${ev.step?.seq ?? '?'}: ${ev.step?.verdict ?? ''}`
                      : ev.type === 'done'
                        ? `done: ${JSON.stringify(ev.result?.summary)}`
                        : ev.type === 'error'
                          ? `error: ${ev.error?.message ?? ''}`
                          : ev.type;
                  setProgress((p) => [...p, line]);
                });
              }}
            />
          ) : null
        }
      >
        <LiveLine live={live} testid="trajectory-live" />
        <ol class="timeline" data-testid="trajectory">
          {(data?.items ?? []).map((s) => (
            <li class={`step step-${s.kind}`}>
              <span class="seq">{`#${s.seq}`}</span> <span class="when">{time(s.startedAt)}</span> <strong>{s.kind}</strong> <code>{stepText(s)}</code>{' '}
              <span class="muted">
                {s.exit ? `exit ${s.exit.exitCode ?? s.exit.signal}` : s.kind === 'exec' ? 'running' : ''}
                {s.durationMs != null ? ` ${Math.round(s.durationMs)} ms` : ''}
                {s.replayable ? '' : ' (not replayable)'}
              </span>
            </li>
          ))}
        </ol>
      </Section>
      {progress.length ? (
        <Section title="Replay">
          {replayed ? (
            <p>
              new sandbox: <a href={`#/sandbox/${encodeURIComponent(replayed)}`}>{replayed}</a>
            </p>
          ) : null}
          <pre class="log" data-testid="replay-progress">
            {progress.join('\n')}
          </pre>
        </Section>
      ) : null}
    </div>
  );
}

interface DiffEntry {
  path: string;
  change: string;
  type: string;
  size?: number;
  sha256?: string;
}

function DiffTab({ base }: { base: string }) {
  const { data, error, reload } = usePoll(
    () => get<{ entries: DiffEntry[]; nextCursor: string | null; frozen: boolean }>(withQuery(`${base}/diff`, { limit: 1000 })),
    0,
    [base],
  );
  return (
    <Section title="Changes against the image" actions={<button onClick={reload}>refresh</button>}>
      <ErrorLine error={error} />
      <Table
        testid="diff"
        head={['change', 'path', 'type', 'size', 'sha256']}
        rows={(data?.entries ?? []).map((d) => [d.change, d.path, d.type, d.size == null ? '' : bytes(d.size), (d.sha256 ?? '').slice(0, 16)])}
      />
      {data?.nextCursor ? <p class="muted">more than 1,000 changes: the first 1,000 are shown</p> : null}
    </Section>
  );
}
