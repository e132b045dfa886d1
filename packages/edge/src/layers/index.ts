// The layer store: content-addressed EROFS layers, their builders, and safe tar extraction.
export { LayerStore, DEFAULT_UNMOUNT_LINGER_MS } from './store.js';
export type { LayerStoreOptions, LayerSource, BuildLayerOptions, LayerGcResult } from './store.js';
export { DEFAULT_TAR_LIMITS, TarExtractor } from './tar-extract.js';
export { DEFAULT_LAYER_REPOSITORY, LayerRegistry, layerTag } from './remote.js';
export type { LayerProfile, LayerRegistryOptions } from './remote.js';
export type { LazyServerStats } from './lazy-server.js';
export { RegistryClient } from './registry.js';
export type { RegistryEndpoint } from './registry.js';
export { parseImageRef } from './image-pull.js';
export type { TarLimits, TarInput, WhiteoutMode, TarExtractorOptions } from './tar-extract.js';
export { DEFAULT_CHUNK_SIZE_BYTES, LAYER_UUID } from './erofs.js';
export { DEFAULT_DEBIAN_SUITE } from './debian.js';
export { BUSYBOX_PATH } from './busybox.js';
export { OVERLAY_OPAQUE_XATTR } from '../sys/linux.js';
