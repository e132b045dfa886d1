// The dashboard's entry: sign-in with an API key (kept in sessionStorage), the role of that key
// (GET /v1/whoami), and the pages, routed by the location's hash (#/sandboxes, #/sandbox/<id>/<tab>).
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import '@xterm/xterm/css/xterm.css';
// uPlot ships its style sheet only under dist/ (a CSS file bundled by esbuild, not compiled code).
// eslint-disable-next-line no-restricted-imports
import 'uplot/dist/uPlot.min.css';
import './style.css';
import { ApiError, forgetKey, get, storeKey, storedKey } from './api.js';
import type { Me } from './api.js';
import { MeContext, errorText } from './components.js';
import { Events, Keys, Layers, Overview, Pools, Projects, Sandboxes } from './pages.js';
import { SandboxPage } from './sandbox.js';

function useHash(): string {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = (): void => setHash(location.hash);
    window.addEventListener('hashchange', on);
    return () => window.removeEventListener('hashchange', on);
  }, []);
  return hash;
}

function SignIn({ onSignedIn, error }: { onSignedIn: (me: Me) => void; error?: string | undefined }) {
  const [key, setKey] = useState('');
  const [message, setMessage] = useState<string | undefined>(error);
  return (
    <form
      class="signin"
      onSubmit={(e) => {
        e.preventDefault();
        storeKey(key.trim());
        get<Me>('/v1/whoami')
          .then(onSignedIn)
          .catch((err: unknown) => {
            forgetKey();
            setMessage(errorText(err));
          });
      }}
    >
      <h1>dsec</h1>
      <label>
        API key
        <input type="password" autocomplete="off" data-testid="key" value={key} onInput={(e) => setKey(e.currentTarget.value)} />
      </label>
      <button type="submit" data-testid="sign-in">
        sign in
      </button>
      <p class="muted">The key is kept in this tab only (session storage) and sent as a header; it never goes into a URL.</p>
      {message ? <p class="error">{message}</p> : null}
    </form>
  );
}

const NAV: Array<[string, string, Me['role']]> = [
  ['overview', 'Overview', 'viewer'],
  ['sandboxes', 'Sandboxes', 'viewer'],
  ['projects', 'Projects', 'viewer'],
  ['keys', 'Keys', 'admin'],
  ['pools', 'Pools', 'viewer'],
  ['layers', 'Layers', 'viewer'],
  ['events', 'Events & audit', 'viewer'],
];
const RANK = { viewer: 0, member: 1, admin: 2 } as const;

function App() {
  const [me, setMe] = useState<Me | null>(null);
  const [checking, setChecking] = useState(storedKey() !== null);
  const [error, setError] = useState<string | undefined>(undefined);
  const hash = useHash();
  useEffect(() => {
    if (!storedKey()) return;
    get<Me>('/v1/whoami')
      .then(setMe)
      .catch((err: unknown) => {
        if (err instanceof ApiError && err.status === 401) forgetKey();
        setError(errorText(err));
      })
      .finally(() => setChecking(false));
  }, []);
  if (checking) return <p class="muted">signing in…</p>;
  if (!me) return <SignIn onSignedIn={setMe} error={error} />;
  const parts = hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'overview';
  const allowed = NAV.filter(([, , role]) => RANK[me.role] >= RANK[role]);
  let body;
  if (page === 'sandbox' && parts[1]) body = <SandboxPage id={parts[1]} tab={parts[2] ?? 'overview'} />;
  else if (page === 'sandboxes') body = <Sandboxes />;
  else if (page === 'projects') body = <Projects />;
  else if (page === 'keys' && me.role === 'admin') body = <Keys />;
  else if (page === 'pools') body = <Pools />;
  else if (page === 'layers') body = <Layers />;
  else if (page === 'events') body = <Events />;
  else body = <Overview />;
  return (
    <MeContext.Provider value={me}>
      <nav class="top">
        <strong class="brand">dsec</strong>
        {allowed.map(([id, label]) => (
          <a href={`#/${id}`} class={page === id ? 'active' : ''} data-testid={`nav-${id}`}>
            {label}
          </a>
        ))}
        <span class="who" data-testid="whoami">{`${me.role} · ${me.project}`}</span>
        <button
          onClick={() => {
            forgetKey();
            setMe(null);
          }}
        >
          sign out
        </button>
      </nav>
      <main>{body}</main>
    </MeContext.Provider>
  );
}

render(<App />, document.getElementById('app')!);
