// What a create request must satisfy on this node before anything is made: system calls the
// kernel knows, a well-formed id, and layers that resolve. Each refusal names the wrong field.
import { DsecError, SYSCALL_NAMES, imageLayers, invalidArgument } from '@dsec/protocol';
import type { LayerInfo, SandboxSpec } from '@dsec/protocol';
import type { LayerStore } from './layers/index.js';

/** A sandbox id: 3-63 characters of a-z, 0-9 and `-`, not starting with `-`. */
const ID_RE = /^[a-z0-9][a-z0-9-]{2,62}$/;

/** INVALID_ARGUMENT for a name in `protect.denySyscalls` that is not a known system call. */
export function checkDeniedSyscalls(spec: SandboxSpec): void {
  for (const [i, name] of (spec.protect?.denySyscalls ?? []).entries()) {
    if (!SYSCALL_NAMES.has(name)) throw invalidArgument(`protect.denySyscalls.${i}`, `${name} is not a known system call`);
  }
}

/** INVALID_ARGUMENT (field `id`) for an id a sandbox cannot have. */
export function checkSandboxId(id: string): void {
  if (!ID_RE.test(id)) throw invalidArgument('id', 'must be 3-63 characters of a-z, 0-9 and -');
}

/**
 * The layers a spec names, its image's first, then its snapshots, pulled from the node's
 * registry where the node lacks them; a layer that does not resolve names its field.
 */
export async function resolveSpecLayers(store: Pick<LayerStore, 'fetch'>, spec: SandboxSpec, signal?: AbortSignal): Promise<LayerInfo[]> {
  const layers: LayerInfo[] = [];
  const refs = [...imageLayers(spec.image), ...(spec.snapshots ?? []).map((ref, i) => ({ field: `snapshots.${i}`, ref }))];
  for (const { field, ref } of refs) {
    const layer = await store.fetch(ref, signal).catch((err: unknown) => {
      if (err instanceof DsecError) err.details.field = field;
      throw err;
    });
    layers.push(layer);
  }
  return layers;
}
