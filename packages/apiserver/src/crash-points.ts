// Test-only kill points: with DSEC_TEST_CRASH_AT=<step> the process SIGKILLs itself the first
// time it reaches that step of a pipeline, so that a test can prove a crash there loses nothing
// and strands nothing (the start-up reconcile settles what was under way). Unset, every point
// is the same empty function: the variable is read once, when this module loads.

/**
 * Every kill point, in pipeline order: each sits between two writes that a crash could
 * separate (a row and its node, a node and its row). The crash test walks this list.
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
  // a warm pool's claim: row taken from the pool, node handed over
  'claim.row',
  'claim.node',
  // snapshot: layer packed on the node, snapshot recorded, layer registered
  'snapshot.node',
  'snapshot.row',
] as const;

/** One kill point's name. */
export type CrashStep = (typeof CRASH_STEPS)[number];

/** The environment variable that arms a kill point (tests only). */
export const CRASH_AT_ENV = 'DSEC_TEST_CRASH_AT';

function armed(step: string | undefined): (at: CrashStep) => void {
  if (!step) return () => undefined;
  if (!(CRASH_STEPS as readonly string[]).includes(step)) throw new Error(`${CRASH_AT_ENV}=${step} is not one of ${CRASH_STEPS.join(', ')}`);
  return (at) => {
    if (at !== step) return;
    // Nothing after this line runs: no handler, no flush, no close (a power cut would do the same).
    process.kill(process.pid, 'SIGKILL');
  };
}

/** Kills this process at `step` when DSEC_TEST_CRASH_AT names it; otherwise does nothing. */
export const crashPoint: (step: CrashStep) => void = armed(process.env[CRASH_AT_ENV]);
