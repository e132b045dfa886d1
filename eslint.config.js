// ESLint for the whole repository: typescript-eslint's strict, type-aware rules, the import
// boundaries between packages, and eslint-config-prettier (formatting is Prettier's job).
// `npm run lint` runs it; `npm test` runs it before the tests.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

/** Packages of this repository, as imported (`@dsec/<name>`) and as folders (`packages/<name>`). */
const PACKAGES = ['protocol', 'sdk', 'edge', 'apiserver', 'watcher', 'cli'];

/**
 * Import paths nobody may use: another package's `src/` or `dist/` (by package name or by a
 * relative path into `packages/`), and any `dist/` folder. Packages are imported by their index
 * only, or by their testing entry point (`@dsec/<name>/testing`: test tools such as the cell's
 * simulated nodes, which the platform never loads), or `@dsec/protocol/errors` (the error class
 * without the schemas, for processes that must start fast: the lazy server).
 */
const DEEP_IMPORTS = [
  { regex: '^@dsec/(?!protocol/errors$)[^/]+/(?!testing$).+', message: 'import a package by its index (`@dsec/<name>`), never a path inside it' },
  {
    regex: `^\\.{1,2}/(.*/)?(packages/|(${PACKAGES.join('|')})/(src|dist)(/|$))`,
    message: 'a relative path into another package: import it by name (`@dsec/<name>`) from its index',
  },
  { regex: '(^|/)dist(/|$)', message: 'never import compiled output (`dist/`): import the source module or the package index' },
];

/**
 * The import boundaries of one part of the repository: `allowed` lists the `@dsec/*` packages it
 * may import (`'*'`: any), always by their index.
 */
function boundary(files, allowed, why) {
  const others = allowed === '*' ? [] : PACKAGES.filter((p) => !allowed.includes(p));
  const patterns = [...DEEP_IMPORTS];
  if (others.length > 0) patterns.push({ regex: `^@dsec/(${others.join('|')})$`, message: why });
  const rules = { 'no-restricted-imports': ['error', { patterns }] };
  if (others.length > 0) {
    // `no-restricted-imports` does not look at `import('...')` expressions.
    rules['no-restricted-syntax'] = ['error', { selector: `ImportExpression[source.value=/^@dsec\\/(${others.join('|')})$/]`, message: why }];
  }
  return { files, rules };
}

export default tseslint.config(
  {
    ignores: ['**/dist/**', '**/node_modules/**', 'chronus/**', 'bench/results/**', 'test/security/attacks/**', '.dsec-test/**'],
  },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        // One TypeScript program per tsconfig.json of the project references, found per file.
        projectService: true,
        tsconfigRootDir: import.meta.dirname,
      },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // The rules the style guide asks for by name.
      '@typescript-eslint/no-floating-promises': ['error', { ignoreVoid: true, ignoreIIFE: false }],
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { arguments: false, attributes: false } }],
      '@typescript-eslint/consistent-type-imports': ['error', { prefer: 'type-imports', fixStyle: 'separate-type-imports' }],
      '@typescript-eslint/consistent-type-exports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'no-restricted-imports': ['error', { patterns: DEEP_IMPORTS }],

      // Turned off: each fights a deliberate pattern of this code base more than it finds bugs.
      // Template literals print numbers, booleans and `unknown` error values on purpose (log
      // lines, messages); the type system already keeps objects out where it matters.
      '@typescript-eslint/restrict-template-expressions': 'off',
      // `x!` after a check TypeScript cannot follow (regex groups, `noUncheckedIndexedAccess`
      // indexes proven by a length test) is the documented idiom here.
      '@typescript-eslint/no-non-null-assertion': 'off',
      // Flags every defensive `?? default` on values that are typed as present but arrive from
      // JSON, the kernel or another process; these checks are intended.
      '@typescript-eslint/no-unnecessary-condition': 'off',
      // `Number(x)` on values from SQL drivers and foreign calls (koffi) whose types are our own
      // declarations: the conversion is the check that a bigint or a string never leaks through.
      '@typescript-eslint/no-unnecessary-type-conversion': 'off',
      // `() => void promise` callbacks and `void` in unions are used as documented.
      '@typescript-eslint/no-confusing-void-expression': 'off',
      '@typescript-eslint/no-invalid-void-type': 'off',
      // Class-free modules and namespaces of static helpers both occur; neither hides a bug.
      '@typescript-eslint/no-extraneous-class': 'off',
      // `a || b` on strings treats '' as absent on purpose (flags, environment variables).
      '@typescript-eslint/prefer-nullish-coalescing': 'off',
      // `async` without `await` is how a method keeps a Promise-returning interface and turns a
      // synchronous throw into a rejection; requiring an await would add noise, not safety.
      '@typescript-eslint/require-await': 'off',
      // Records keyed by ids and names (`delete env[name]`) are plain JSON objects on purpose.
      '@typescript-eslint/no-dynamic-delete': 'off',
    },
  },
  {
    // Plain JavaScript (this file, the CLI's launcher): no type information; Node's globals.
    files: ['**/*.js', '**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { process: 'readonly', console: 'readonly', URL: 'readonly' },
    },
  },
  {
    // Tests: node:test's `describe`/`it` return promises the runner awaits itself.
    files: ['**/*.test.ts', 'test/**/*.ts', 'bench/**/*.ts'],
    rules: {
      // Tests read JSON bodies (`any`) and let the assertions check their shape.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-floating-promises': [
        'error',
        { ignoreVoid: true, allowForKnownSafeCalls: [{ from: 'package', name: ['describe', 'it', 'test', 'suite'], package: 'node:test' }] },
      ],
    },
  },
  // Import boundaries: who may import whom (always by the package's index).
  boundary(['packages/protocol/**'], [], '@dsec/protocol is the bottom of the stack: it imports no other @dsec package'),
  boundary(['packages/sdk/**'], ['protocol'], '@dsec/sdk imports only @dsec/protocol (it is shipped to users alone)'),
  boundary(['packages/edge/**'], ['protocol'], '@dsec/edge imports only @dsec/protocol (never the apiserver)'),
  boundary(['packages/watcher/**'], ['protocol'], '@dsec/watcher imports only @dsec/protocol'),
  boundary(
    ['packages/apiserver/**'],
    ['protocol', 'watcher'],
    '@dsec/apiserver reaches the edge through the EdgeClient interface of @dsec/protocol; only its composition root (platform.ts) imports @dsec/edge',
  ),
  boundary(['packages/apiserver/src/platform.ts'], ['protocol', 'watcher', 'edge'], 'the composition root imports @dsec/edge by its index only'),
  // `dsec apiserver` is a composition root too: its node port signs nodes with the edge's cert tools.
  boundary(['packages/apiserver/src/replica.ts'], ['protocol', 'watcher', 'edge'], 'the replica composition root imports @dsec/edge by its index only'),
  boundary(
    ['packages/apiserver/src/cluster/*.test.ts'],
    ['protocol', 'watcher', 'edge'],
    'the node port tests drive a real node agent (@dsec/edge by its index)',
  ),
  boundary(['packages/cli/**', 'test/**', 'bench/**'], '*', ''),
  // The dashboard runs in a browser and talks to the API over HTTP only.
  boundary(['ui/**'], [], 'the dashboard (ui/) runs in a browser: it reaches dsec through the HTTP API, never by importing a package'),
  prettier,
);
