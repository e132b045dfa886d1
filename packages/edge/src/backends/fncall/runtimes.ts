// The built-in runtimes of function calls: each is a layer (built on first use and kept in the
// node's layer store) plus the command line that runs a snippet of source text.
import type { CallRuntime } from '@dsec/protocol';
import type { LayerSource } from '../../layers/index.js';

/** A built-in runtime. */
export interface RuntimeDefinition {
  /** Layer name in the node's store. */
  layerName: string;
  /** How the layer is built when the store does not have it yet. */
  source: LayerSource;
  /** The command line that runs `code`. */
  argv(code: string): string[];
}

/** The runtimes every node offers. python3 and node are Debian package sets (built in ~25 s). */
export const RUNTIMES: Record<CallRuntime, RuntimeDefinition> = {
  sh: { layerName: 'busybox', source: { type: 'busybox' }, argv: (code) => ['/bin/sh', '-c', code] },
  python3: { layerName: 'fncall-python3', source: { type: 'debian', packages: ['python3'] }, argv: (code) => ['python3', '-c', code] },
  node: { layerName: 'fncall-node', source: { type: 'debian', packages: ['nodejs'] }, argv: (code) => ['node', '-e', code] },
};
