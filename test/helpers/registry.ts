// Test fixture: a docker-registry on loopback (it lives in @dsec/edge's testing/oci-registry.ts so
// that the benchmark can start one too).
export { startOciRegistry as startRegistry } from '@dsec/edge';
export type { OciRegistry as TestRegistry } from '@dsec/edge';
