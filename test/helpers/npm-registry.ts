// The local npm registry of the egress tests: the one fixture that the `install` benchmark uses
// too (it lives in @dsec/edge's testing/npm-registry.ts so that both can import it).
export { REGISTRY_BASE_PLACEHOLDER, generatePackageTree, npmTarball, startNpmRegistry } from '@dsec/edge';
export type { GeneratedTree, NpmRegistry, NpmRegistryContents, NpmRegistryOptions } from '@dsec/edge';
