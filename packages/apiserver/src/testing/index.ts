// The testing entry point of the apiserver (`@dsec/apiserver/testing`): in-memory nodes for
// tests and the simulated cell. Nothing in the platform imports it.
export { FakeEdge, fakeLayer, fakeOutput } from './fake-edge.js';
export { CONTAINER_DELAYS, SIM_IDLE_SANDBOX_BYTES, SimEdge } from './sim-edge.js';
export type { SimDelays, SimEdgeOptions } from './sim-edge.js';
