// Test-only kill points: with DSEC_TEST_CRASH_AT=<step> a process SIGKILLs itself the first
// time it reaches that step of a pipeline, so that a test can prove a crash there loses nothing
// and strands nothing (the start-up reconcile settles what was under way). Unset, every point
// is the same empty function: the variable is read once, when this module loads. The control
// plane's steps and the edge's are listed here together, so that either process accepts a step
// of the other (an in-process node runs both) and refuses a name that is neither's.

/**
 * The control plane's kill points, in pipeline order: each sits between two writes that a crash
 * could separate (a row and its node, a node and its row). The crash test walks this list.
 */
export const CRASH_STEPS = [
  // create (one, a batch's items, a pool's refill): quota reserved, row written, node created, row running
  'create.reserved',
  'create.row',
  'create.node',
  'create.running',
  // a batch: quota of every item reserved in one transaction, nothing created yet
  'batch.reserved',
  // delete: row claimed (stopping), node destroyed, row gone
  'delete.stopping',
  'delete.node',
  // pause and resume: row claimed, node done, row settled
  'pause.pausing',
  'pause.node',
  'resume.resuming',
  'resume.node',
  // a warm pool's claim: row taken from the pool (`creating`), node handed over, row running
  'claim.row',
  'claim.node',
  'claim.running',
  // snapshot: layer packed on the node, snapshot recorded, layer registered
  'snapshot.node',
  'snapshot.row',
] as const;

/**
 * The edge's kill points, in pipeline order (Edge.create and Edge.destroy): each sits between
 * two steps of the node's own work that a crash of the edge process alone could separate. The
 * edge chaos test walks this list.
 */
export const EDGE_CRASH_STEPS = [
  // create: layers resolved (nothing of the sandbox made), the backend made it (not yet on the
  // network), it joined its network (not yet registered nor answered)
  'edge.create.layers',
  'edge.create.backend',
  'edge.create.network',
  // delete: begun (no longer monitored, still in the backend), the backend destroyed it (its
  // network not yet removed), its network removed (still listed, not yet answered)
  'edge.delete.begun',
  'edge.delete.backend',
  'edge.delete.network',
] as const;

/**
 * Kill points inside the backends' and the node network's own steps, in pipeline order: each
 * sits between two host changes of one create or teardown that a crash of the edge process
 * alone could separate. The edge chaos test walks the container's and the network's with the
 * edge's (EDGE_CRASH_STEPS); the microVM's are walked under `npm run test:long`.
 */
export const BACKEND_CRASH_STEPS = [
  // container create: folder, layer references, id range, writable layer folder, bundle and
  // record written, crun not run; then crun ran (the container runs, its agent not yet asked)
  'container.create.bundle',
  'container.create.started',
  // network setup: the sandbox's link made in its namespace, its policy not yet saved
  'network.link.attached',
  // container teardown: processes killed and cgroups gone, writable layer still mounted; then
  // the writable layer unmounted, layer references, folder and id range still held
  'container.destroy.ended',
  'container.destroy.unmounted',
] as const;

/**
 * The microVM's kill points: QEMU started and its guest not yet ready (the microVM create);
 * QEMU killed and its cgroup gone, its folder, disk, namespace and id range still there (the
 * QEMU base's teardown, which `vm` shares).
 */
export const MICROVM_CRASH_STEPS = ['microvm.create.launched', 'qemu.destroy.killed'] as const;

/** One control-plane kill point's name. */
export type CrashStep = (typeof CRASH_STEPS)[number];
/** One edge kill point's name (the edge's own, a backend's or the node network's: all run in the edge process). */
export type EdgeCrashStep = (typeof EDGE_CRASH_STEPS)[number] | (typeof BACKEND_CRASH_STEPS)[number] | (typeof MICROVM_CRASH_STEPS)[number];

/** The environment variable that arms a kill point (tests only). */
export const CRASH_AT_ENV = 'DSEC_TEST_CRASH_AT';

function armed(step: string | undefined): (at: string) => void {
  if (!step) return () => undefined;
  const known: readonly string[] = [...CRASH_STEPS, ...EDGE_CRASH_STEPS, ...BACKEND_CRASH_STEPS, ...MICROVM_CRASH_STEPS];
  if (!known.includes(step)) throw new Error(`${CRASH_AT_ENV}=${step} is not one of ${known.join(', ')}`);
  return (at) => {
    if (at !== step) return;
    // Nothing after this line runs: no handler, no flush, no close (a power cut would do the same).
    process.kill(process.pid, 'SIGKILL');
  };
}

const point = armed(typeof process === 'undefined' ? undefined : process.env[CRASH_AT_ENV]);

/** Kills this process at `step` when DSEC_TEST_CRASH_AT names it; otherwise does nothing. */
export const crashPoint: (step: CrashStep | EdgeCrashStep) => void = point;
