// The web dashboard (docs/dashboard.md) at /ui: the static files `npm run build` writes to
// ui/dist, served from memory with their types, long caching for the hashed assets, none for the
// page, and a Content-Security-Policy that allows only this origin's own scripts (no inline
// script, no eval, nothing from elsewhere). The dashboard talks to /v1 with the key header.
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Hono } from 'hono';
import type { Env } from './env.js';

/** Where `npm run build` puts the dashboard (from packages/apiserver/dist/http or src/http). */
export const DEFAULT_UI_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../ui/dist');

/**
 * The policy of every /ui response. Scripts come only from this origin (no inline script, no
 * eval). Styles allow 'unsafe-inline' because xterm.js writes its own <style> elements (with
 * `style-src 'self'` Chromium blocks them and the terminal breaks; the dashboard test checks
 * that the page raises no policy violation).
 */
export const UI_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "font-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.map': 'application/json; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
};

const SECURITY_HEADERS = {
  'content-security-policy': UI_CSP,
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
};

interface UiFile {
  body: Uint8Array;
  type: string;
  cache: string;
}

/** The files of a built dashboard, keyed by their path under /ui/ ('' is the page). */
async function loadUi(dir: string): Promise<Map<string, UiFile>> {
  const files = new Map<string, UiFile>();
  const walk = async (sub: string): Promise<void> => {
    for (const e of await readdir(path.join(dir, sub), { withFileTypes: true })) {
      const rel = sub ? `${sub}/${e.name}` : e.name;
      // Only the page and its assets (ui/dist also holds tsc's declarations).
      if (e.isDirectory()) {
        if (rel === 'assets' || rel.startsWith('assets/')) await walk(rel);
      } else if (e.isFile()) {
        const type = TYPES[path.extname(e.name)];
        if (!type) continue;
        // Assets carry their content hash in their name (esbuild): cached for good; the page never.
        const cache = rel.startsWith('assets/') ? 'public, max-age=31536000, immutable' : 'no-cache';
        files.set(rel, { body: await readFile(path.join(dir, rel)), type, cache });
      }
    }
  };
  await walk('');
  const index = files.get('index.html');
  if (index) files.set('', index);
  return files;
}

/** The /ui routes: the dashboard from `dir`, or 503 with what to do when it was not built. */
export function uiRoutes(dir = DEFAULT_UI_DIR): Hono<Env> {
  let loading: Promise<Map<string, UiFile>> | undefined;
  const files = (): Promise<Map<string, UiFile>> => {
    loading ??= loadUi(dir).catch(() => {
      loading = undefined;
      return new Map<string, UiFile>();
    });
    return loading;
  };
  const app = new Hono<Env>();
  app.get('/', (c) => c.redirect('/ui/', 301));
  app.get('/*', async (c) => {
    const rel = c.req.path.slice('/ui/'.length);
    const all = await files();
    // Paths without a file are the page (the dashboard routes in its hash, these are fallbacks).
    const file = all.get(rel) ?? (rel.startsWith('assets/') ? undefined : all.get(''));
    if (!file) {
      const status = all.size === 0 ? 503 : 404;
      const text = all.size === 0 ? 'the dashboard is not built: run npm run build (ui/dist)\n' : 'not found\n';
      return c.text(text, status, { ...SECURITY_HEADERS, 'cache-control': 'no-store' });
    }
    return c.body(file.body.slice(), 200, { ...SECURITY_HEADERS, 'content-type': file.type, 'cache-control': file.cache });
  });
  return app;
}
