// The control plane's test-only kill points (DSEC_TEST_CRASH_AT): the mechanism and the list of
// steps live in @dsec/protocol (crash-points.ts), with the edge's.
export { CRASH_AT_ENV, CRASH_STEPS, crashPoint } from '@dsec/protocol';
export type { CrashStep } from '@dsec/protocol';
