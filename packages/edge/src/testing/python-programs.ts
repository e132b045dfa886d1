// Python programs whose output, errors and exit status must be the same in a warm interpreter
// (`backends/fncall/warm-python.ts`) as under `python3 -c`: the stub's unit test runs each against
// the host's python3, the fncall end-to-end test runs some as calls, warm and cold.
export const PYTHON_PROGRAMS = {
  print: 'print(1)',
  /** An uncaught exception two frames deep (a traceback naming `<string>`). */
  raises: 'def f():\n    return 1 / 0\nf()',
  /** Fails before its first line runs. */
  syntaxError: 'x = (',
  exitMessage: 'raise SystemExit("bye")',
  exitStatus: 'raise SystemExit(3)',
  hardExit: 'import os\nos._exit(9)',
  excepthook: 'import sys\nsys.excepthook = lambda *a: print("hooked", a[0].__name__)\nraise ValueError()',
  chained: 'try:\n    {}["k"]\nexcept KeyError:\n    raise RuntimeError("in handling")',
  unicode: 'print("é", end="")',
} as const;
