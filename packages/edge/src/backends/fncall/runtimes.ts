// The built-in runtimes of function calls: each is a layer plus how a snippet of source text
// runs in it. The Debian layers are built in the background (runtime-builds.ts): several small
// package sets rather than one, so that python and bash are ready long before java and go.
import { createHash } from 'node:crypto';
import type { CallRuntime } from '@dsec/protocol';

/** A runtime's layer: busybox (built on first use in a moment), or a set of Debian packages. */
export type RuntimeLayer = { type: 'busybox'; name: string } | { type: 'debian'; id: string; packages: string[] };

/** Debian package sets of the runtimes, in the order a node builds them ahead of use. */
export const RUNTIME_LAYERS = {
  python: { type: 'debian', id: 'python', packages: ['python3', 'python3-pytest'] },
  node: { type: 'debian', id: 'node', packages: ['nodejs'] },
  gcc: { type: 'debian', id: 'gcc', packages: ['gcc', 'g++', 'libc6-dev'] },
  go: { type: 'debian', id: 'go', packages: ['golang-go'] },
  java: { type: 'debian', id: 'java', packages: ['default-jdk-headless'] },
} as const satisfies Record<string, RuntimeLayer>;

/** A Debian runtime layer's id (`python`, `gcc`, ...). */
export type RuntimeLayerId = keyof typeof RUNTIME_LAYERS;

const BUSYBOX: RuntimeLayer = { type: 'busybox', name: 'busybox' };

/** A built-in runtime. */
export interface RuntimeDefinition {
  layer: RuntimeLayer;
  /** For compiled languages: the file `code` is written to under /work, and its compile command. */
  compile?: { file: string; argv: string[] };
  /** The command line that runs `code` (after the compile step, if any). */
  argv(code: string): string[];
  /** Environment the runtime needs (build caches on the writable tmpfs). */
  env?: Record<string, string>;
}

/** The runtimes every node offers. */
export const RUNTIMES: Record<CallRuntime, RuntimeDefinition> = {
  sh: { layer: BUSYBOX, argv: (code) => ['/bin/sh', '-c', code] },
  bash: { layer: RUNTIME_LAYERS.python, argv: (code) => ['bash', '-c', code] },
  python3: { layer: RUNTIME_LAYERS.python, argv: (code) => ['python3', '-c', code] },
  node: { layer: RUNTIME_LAYERS.node, argv: (code) => ['node', '-e', code] },
  c: { layer: RUNTIME_LAYERS.gcc, compile: { file: 'main.c', argv: ['gcc', '-O2', '-o', 'main', 'main.c', '-lm'] }, argv: () => ['./main'] },
  cpp: {
    layer: RUNTIME_LAYERS.gcc,
    compile: { file: 'main.cpp', argv: ['g++', '-std=c++17', '-O2', '-pthread', '-o', 'main', 'main.cpp'] },
    argv: () => ['./main'],
  },
  go: {
    layer: RUNTIME_LAYERS.go,
    compile: { file: 'main.go', argv: ['go', 'build', '-o', 'main', 'main.go'] },
    argv: () => ['./main'],
    env: { GOCACHE: '/tmp/go-cache', GOPATH: '/tmp/go', GOFLAGS: '-buildvcs=false', GOTOOLCHAIN: 'local' },
  },
  java: { layer: RUNTIME_LAYERS.java, compile: { file: 'Main.java', argv: ['javac', 'Main.java'] }, argv: () => ['java', '-ea', '-cp', '.', 'Main'] },
};

/** Name of a Debian runtime layer in a node's store and in the machine-wide cache: its id and a hash of its inputs. */
export function runtimeLayerName(layer: Extract<RuntimeLayer, { type: 'debian' }>, suite: string): string {
  const key = createHash('sha256')
    .update(JSON.stringify({ v: 1, suite, packages: layer.packages }))
    .digest('hex')
    .slice(0, 12);
  return `fncall-${layer.id}-${key}`;
}
