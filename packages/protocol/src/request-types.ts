// Types of request bodies and queries whose schemas carry no exported type of their own, inferred
// from those schemas so that a service can take the parsed value without naming zod.
import type { z } from 'zod';
import type { CreateKeyRequestSchema, CreateProjectRequestSchema, DebianLayerRequestSchema, OutputQuerySchema, ResumeRequestSchema, SnapshotRequestSchema, TrajectoryQuerySchema, UploadLayerQuerySchema } from './api.js';

/** POST /v1/projects */
export type CreateProjectRequest = z.output<typeof CreateProjectRequestSchema>;
/** POST /v1/keys */
export type CreateKeyRequest = z.output<typeof CreateKeyRequestSchema>;
/** POST /v1/sandboxes/{id}/resume */
export type ResumeRequest = z.output<typeof ResumeRequestSchema>;
/** POST /v1/sandboxes/{id}/snapshot */
export type SnapshotRequest = z.output<typeof SnapshotRequestSchema>;
/** GET /v1/sandboxes/{id}/trajectory */
export type TrajectoryQuery = z.output<typeof TrajectoryQuerySchema>;
/** POST /v1/layers (query) */
export type UploadLayerQuery = z.output<typeof UploadLayerQuerySchema>;
/** POST /v1/layers/debian */
export type DebianLayerRequest = z.output<typeof DebianLayerRequestSchema>;
/** GET /v1/sandboxes/{id}/processes/{pid}/output (query) */
export type OutputQuery = z.output<typeof OutputQuerySchema>;
