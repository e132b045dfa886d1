// Backends, resource requests and limits (with their defaults), and the capacity of nodes.
import { z } from 'zod';

/** The four isolation backends of dsec. */
export const BackendKindSchema = z.enum(['fncall', 'container', 'microvm', 'vm']);

/** One of the four isolation backends. */
export type BackendKind = z.infer<typeof BackendKindSchema>;

/** Default CPU request in cores. */
export const DEFAULT_CPU = 1;

/** Default memory limit. */
export const DEFAULT_MEMORY_MIB = 512;

/** Default size of the writable layer. */
export const DEFAULT_DISK_MIB = 1024;

/** Default process limit. */
export const DEFAULT_PIDS = 512;

/** Default open-file limit (RLIMIT_NOFILE). */
export const DEFAULT_OPEN_FILES = 4096;

/** Resource requests and limits of a sandbox. */
export const ResourcesSchema = z.strictObject({
  /** CPU in cores (fractions allowed); sets the weight and the quota. */
  cpu: z.number().positive().max(256).optional(),
  memoryMiB: z.number().int().min(16).max(1_048_576).optional(),
  diskMiB: z.number().int().min(1).max(1_048_576).optional(),
  pids: z.number().int().min(8).max(1_000_000).optional(),
  openFiles: z.number().int().min(64).max(1_048_576).optional(),
  /** latency-sensitive (default) or best-effort (SCHED_IDLE, low weight). */
  cpuClass: z.enum(['latency-sensitive', 'best-effort']).optional(),
});

/** Resource requests and limits of a sandbox. */
export type Resources = z.infer<typeof ResourcesSchema>;

/** Resources as granted (defaults filled in). */
export const GrantedResourcesSchema = z.object({
  cpu: z.number(),
  memoryMiB: z.number(),
  diskMiB: z.number(),
  pids: z.number(),
  cpuClass: z.enum(['latency-sensitive', 'best-effort']),
});

export type GrantedResources = z.infer<typeof GrantedResourcesSchema>;

/** A virtual machine's accelerator: KVM, or QEMU's TCG emulation where KVM is not usable. */
export const AccelSchema = z.enum(['kvm', 'tcg']);

/** A virtual machine's accelerator. */
export type Accel = z.infer<typeof AccelSchema>;

/** The accelerator of each virtual-machine backend of a node (absent: the node lacks it). */
export const BackendAccelSchema = z.object({ microvm: AccelSchema.optional(), vm: AccelSchema.optional() });

/** The accelerator of each virtual-machine backend of a node. */
export type BackendAccel = z.infer<typeof BackendAccelSchema>;

/** A node's capacity and use. */
export const NodeSchema = z.object({
  name: z.string(),
  healthy: z.boolean(),
  backends: z.array(BackendKindSchema),
  /**
   * The accelerator each virtual-machine backend of the node boots under (the microVM backend's
   * boot probe at node start; `vm` takes the same verdict unless its config sets one). A backend
   * the node lacks is absent.
   */
  accel: BackendAccelSchema.optional(),
  /** `accel.microvm`, kept for clients that read it. */
  microvmAccel: AccelSchema.optional(),
  capacity: z.object({ cpu: z.number(), memoryMiB: z.number(), sandboxes: z.number() }),
  allocatable: z.object({ cpu: z.number(), memoryMiB: z.number() }),
  allocated: z.object({ cpu: z.number(), memoryMiB: z.number(), sandboxes: z.number() }),
});

/** A node's capacity and use. */
export type NodeInfo = z.infer<typeof NodeSchema>;
