// The chunk cache of lazily loaded layers, as a node reports it (GET /v1/nodes/{name}).
import { z } from 'zod';

/** A node's chunk cache and what its lazy layers fetched since its edge started. */
export const LayerCacheStatsSchema = z.object({
  /** Bytes and chunks in the node-wide chunk cache. */
  cacheBytes: z.number(),
  cacheChunks: z.number(),
  /** Its bound (`node.registry.chunkCacheMaxBytes`); null when unbounded. */
  cacheMaxBytes: z.number().nullable(),
  /** Chunk reads served from the cache, and those that needed a fetch. */
  hits: z.number(),
  misses: z.number(),
  /** hits / (hits + misses); null before any read. */
  hitRate: z.number().nullable(),
  /** Bytes and chunks fetched from the registry. */
  fetchedBytes: z.number(),
  fetchedChunks: z.number(),
  /** Fetches that failed (`layer.fetch-failed`) and chunks refused (`layer.corrupt`). */
  failures: z.number(),
  corrupt: z.number(),
  /** Lazy layers with a server: mounted, or unmounted and kept idle (`lazyServerIdleMs`). */
  lazyLayers: z.number(),
});
/** A node's chunk cache statistics. */
export type LayerCacheStats = z.infer<typeof LayerCacheStatsSchema>;
