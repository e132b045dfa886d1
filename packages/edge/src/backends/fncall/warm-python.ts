// A warm python3 for the next call of a call sandbox. A reset kills every process of the sandbox
// between two calls (runner.ts, `resetSandbox`), so an interpreter that outlived a call could
// carry its state: instead, right after each reset (and after a sandbox is made), the runner
// starts a fresh `python3 -c <stub>` in the clean sandbox, as the call's uid, with the call's
// environment, cwd and limits. Its start-up (the interpreter, `site`, the codecs) happens off any
// call's path; the stub then blocks on stdin. A `python3 -c CODE` call claimed by that sandbox
// writes "<bytes>\n" + CODE + the call's stdin to it; the stub runs CODE as `-c` would, in the
// real `__main__`, and the rest of stdin is the code's own. Each call is still a process of its
// own that starts in a sandbox no earlier call touched since its reset.
import type { CallRequest } from '@dsec/protocol';

/**
 * The stub the warm interpreter runs. It moves every object of the start-up into the collector's
 * permanent generation (`gc.freeze()`: none of them is the call's, and the collections of the
 * interpreter's exit then skip them, ~2.5 ms of a trivial call here). It reads the header and the code with `os.read` (nothing
 * is left in `sys.stdin`'s buffer), removes its own name from `__main__`, points `sys.orig_argv`
 * at the code, drops the path importer cache (the call's files came after start-up), adds the
 * user site directory when the call's files made one (`python3 -c` would have found it), then runs
 * the code with `__main__`'s globals. An uncaught exception is reported without the stub's frame
 * and ends with status 1, as `python3 -c` does (a KeyboardInterrupt by SIGINT, as there);
 * SystemExit passes through. EOF before the whole code (the sandbox being reset) exits at once.
 */
export const WARM_PYTHON_STUB = [
  'def _dsec_warm():',
  '    import gc, os, sys',
  '    gc.freeze()',
  "    head = b''",
  "    while not head.endswith(b'\\n'):",
  '        c = os.read(0, 1)',
  '        if not c or len(head) > 20:',
  '            os._exit(0)',
  '        head += c',
  '    n = int(head)',
  '    buf = bytearray()',
  '    while len(buf) < n:',
  '        c = os.read(0, min(n - len(buf), 1 << 20))',
  '        if not c:',
  '            os._exit(0)',
  '        buf += c',
  "    code = bytes(buf).decode('utf-8', 'surrogateescape')",
  '    del buf, head',
  "    del globals()['_dsec_warm']",
  // The user site (HOME is the call's /work) that the call's own files made after start-up: added
  // where start-up would have put it, before the system's site directories.
  '    import site',
  "    u = getattr(site, 'USER_SITE', None)",
  '    if site.ENABLE_USER_SITE and u and u not in sys.path and os.path.isdir(u):',
  '        known = list(sys.path)',
  '        site.addsitedir(u)',
  '        added = sys.path[len(known):]',
  '        system = set(site.getsitepackages())',
  '        at = next((i for i, p in enumerate(known) if p in system), len(known))',
  '        sys.path[:] = known[:at] + added + known[at:]',
  "    if getattr(sys, 'orig_argv', None):",
  '        sys.orig_argv[-1] = code',
  '    sys.path_importer_cache.clear()',
  '    try:',
  "        exec(compile(code, '<string>', 'exec'), globals())",
  '    except SystemExit:',
  '        raise',
  '    except BaseException as e:',
  '        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None',
  '        e.__traceback__ = tb',
  '        sys.excepthook(type(e), e, tb)',
  '        if isinstance(e, KeyboardInterrupt):',
  '            import signal',
  '            signal.signal(signal.SIGINT, signal.SIG_DFL)',
  '            os.kill(os.getpid(), signal.SIGINT)',
  '        sys.exit(1)',
  '_dsec_warm()',
].join('\n');

/** The argv of a warm interpreter (what `python3 -c CODE` runs, with the stub for CODE). */
export const WARM_PYTHON_ARGV: readonly string[] = ['python3', '-c', WARM_PYTHON_STUB];

/**
 * True when a call can run in a warm interpreter: `python3` with `code` (not `argv`), no
 * environment of its own (variables such as `PYTHONPATH` or `LANG` act on the interpreter's
 * start-up, which happened before the call) and no NUL byte (which `-c` cannot take either).
 */
export function warmPythonEligible(spec: CallRequest): boolean {
  return (
    spec.runtime === 'python3' &&
    spec.code !== undefined &&
    spec.argv === undefined &&
    (spec.env === undefined || Object.keys(spec.env).length === 0) &&
    !spec.code.includes('\0')
  );
}

/** What the edge writes to a warm interpreter's stdin for one call: the header, the code, then the call's stdin. */
export function warmPythonInput(code: string, stdin?: string): Buffer {
  const body = Buffer.from(code, 'utf8');
  return Buffer.concat([Buffer.from(`${body.length}\n`), body, Buffer.from(stdin ?? '', 'utf8')]);
}
