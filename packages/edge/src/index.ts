export { Edge, MAX_HELD_EVENTS, PAUSE_DRAIN_TIMEOUT_MS } from './edge.js';
export type { EdgeParts, ExecOptions, PauseResult, ResumeResult } from './edge-options.js';
export { DEFAULT_MAX_SANDBOXES } from './edge-options.js';
export type { EdgeOptions } from './edge-options.js';
export { DEFAULT_MAX_OUTPUT_BYTES } from './commands.js';
export { MAX_FILE_READ_BYTES } from './files.js';
export { DEFAULT_COUNTER_SCAN_MS, SURVIVOR_GRACE_MS } from './sandbox-monitor.js';
export { SNAPSHOT_PARENTS_LABEL, SNAPSHOT_SANDBOX_LABEL } from './snapshots.js';
export type { SnapshotOptions } from './snapshots.js';
export { EdgeProcessStream } from './process-stream.js';
export type { ExitJudge } from './process-stream.js';
export type {
  Backend,
  BackendCreateRequest,
  BackendFactory,
  BackendHost,
  BackendPauseResult,
  BackendResumeResult,
  BackendSandbox,
  CounterFacet,
  GarbageFacet,
  GarbageOptions,
  GarbageReport,
  HostProcessFacet,
  NetworkFacet,
  PauseFacet,
  SandboxAgent,
  ScreenFacet,
  SandboxCounters,
  SandboxMemory,
  WritableLayerFacet,
  ProtectedPathFacet,
} from './backend.js';
export { defaultBackends } from './backends/index.js';
export { containerBackend } from './backends/container/index.js';
export * from './backends/microvm/index.js';
export * from './backends/vm/index.js';
export type { ContainerBackendConfig } from './backends/container/index.js';
export { ContainerBackend, DEFAULT_OUTPUT_CAP_BYTES, EMPTY_CGROUP_GRACE_MS } from './backends/container/backend.js';
export type { ContainerBackendOptions, LayerMounter } from './backends/container/backend.js';
export { ChronusClient, DEFAULT_WINDOW_BYTES } from './chronus/client.js';
export { Attachment } from './chronus/attachment.js';
export { signalNumber } from './chronus/replies.js';
export type { AgentExit, AgentInfo, AgentProcess, OutputEvent, SpawnOptions } from './chronus/client.js';
export { Cgroups, detectCgroupMode, DEFAULT_FREEZE_TIMEOUT_MS, PAUSED_SWAPPINESS } from './host/cgroups.js';
export type { CgroupMode, CgroupStats, MemorySettings, PrefetchResult, ReclaimResult } from './host/cgroups.js';
export { ZramSwap, ZRAM_MARKER_DIR, MAX_ZRAM_SWAP_MIB } from './host/swap.js';
export type { ZramSwapOptions } from './host/swap.js';
export { DEFAULT_ID_RANGE, checkIdShift, withShiftedView } from './host/idmap.js';
export { MAX_SERVER_RESTARTS, RESTART_WINDOW_MS } from './host/security-monitor.js';
export type { IdShift } from './host/idmap.js';
export { LayerRegistry, LayerStore, layerTag, parseImageRef, RegistryClient } from './layers/index.js';
export { buildThroughCache } from './layers/machine-cache.js';
export { BUSYBOX_PATH } from './layers/busybox.js';
export type { BuildLayerOptions, LayerProfile, LayerSource, LayerStoreOptions, LazyServerStats } from './layers/index.js';
export { mount, umount, MS, MNT, mountsUnder, SyscallError, idmappedBind } from './sys/linux.js';
export { FnCallRunner, MAX_CONCURRENT_CALLS } from './backends/fncall/runner.js';
export type { FnCallRunnerOptions } from './backends/fncall/runner.js';
export { fncallRunner } from './backends/fncall/index.js';
export type { CallRunner, CallRunnerFactory, FnCallRunnerConfig } from './backends/fncall/index.js';
export { RUNTIMES, RUNTIME_LAYERS, runtimeLayerName } from './backends/fncall/runtimes.js';
export type { RuntimeLayerId } from './backends/fncall/runtimes.js';
export { RuntimeBuilds } from './backends/fncall/runtime-builds.js';
export type { RuntimeDefinition } from './backends/fncall/runtimes.js';
export { IdRanges, ID_RANGE_START, ID_RANGE_SIZE, DEFAULT_ID_RANGE_DIR } from './host/id-ranges.js';
export { runDirFor } from './host/runtime-ns.js';
export { PLATFORM_MOUNT_POINTS } from './diff.js';
export type { IdRange } from './host/id-ranges.js';
export { defaultSeccompProfile, DENIED_SYSCALLS, DENIED_IOCTLS, PTRACE_SYSCALLS } from './backends/container/seccomp.js';
export type { SeccompProfile } from './backends/container/seccomp.js';
export { NodeNetwork, purgeHome, KERNEL_LOG_RATE_PER_SECOND, ifPrefixOf, tableOf } from './net/network.js';
export type { NetworkOptions, NodeNetworkDeps, SandboxNetworkInfo } from './net/network.js';
export { DEFAULT_NETWORK_POOL, DEFAULT_SLICE_PREFIX } from './net/pool.js';
export { EXPLICIT_PROXY_PORT } from './net/kernel.js';
export { compilePolicy } from './net/policy.js';
export type {
  EgressLogEntry,
  EgressLogSink,
  EgressPolicyView,
  EgressProxyLimits,
  EgressProxyPorts,
  EgressStats,
  EgressVerdict,
  EgressVia,
  NameResolver,
  SandboxResolver,
  StartEgressProxy,
} from './net/types.js';
export { makeCertificate, makeCertificateAuthority } from './net/proxy/certificate.js';
export type { TestCertificateAuthority } from './net/proxy/certificate.js';
export {
  startEgressProxy,
  NpmMirrorAdapter,
  DEFAULT_BYTES_PER_SECOND,
  DEFAULT_CONNECTION_QUEUE_MS,
  DEFAULT_MAX_CONNECTIONS,
  DEFAULT_MAX_CONNECTIONS_PER_SANDBOX,
  DEFAULT_EXPLICIT_PORT,
} from './net/proxy/index.js';
export { OPERATOR_CA_FILE, SYSTEM_CA_BUNDLE, loadCaCertificates, trustEnv } from './net/trust.js';
export type {
  EgressProxyHandle,
  EgressProxyOptions,
  ConnectionRecord,
  EgressReason,
  MirrorAdapter,
  MirrorCacheStats,
  MirrorServiceOptions,
} from './net/proxy/index.js';
// Cluster membership of a node (dsec edge --join) and the certificate helpers it shares with the control plane.
export { nodeNameOf } from './node-host.js';
export { certSha256, makeCsr, makeKey, openssl } from './cluster/tls.js';
export { NodeAgent, credentialsDir } from './cluster/node-agent.js';
export type { NodeAgentOptions } from './cluster/node-agent.js';
export { REGISTRY_BASE_PLACEHOLDER, contentsFromTarballs, generatePackageTree, npmTarball, startNpmRegistry, tarballManifest } from './testing/npm-registry.js';
export type { GeneratedTree, NpmRegistry, NpmRegistryContents, NpmRegistryOptions } from './testing/npm-registry.js';
export { buildDeb, makeRepoKey, pyDistributionFile, startStaticRepo, writeDebianRepo, writePypiIndex, zipStored } from './testing/package-repos.js';
export type { DebPackage, PyDistribution, RepoKey, StaticRepo } from './testing/package-repos.js';
export { startOciRegistry } from './testing/oci-registry.js';
export type { OciRegistry, OciRegistryOptions } from './testing/oci-registry.js';
export { seededRandom } from './testing/prng.js';
export { PYTHON_PROGRAMS } from './testing/python-programs.js';
export { makeNamespaceLink, removeNamespaceLink } from './testing/netns-link.js';
export type { NamespaceLink } from './testing/netns-link.js';
export { decodePng } from './testing/png.js';
export { countPixels, desktopShown, DESKTOP_XTERM, diffPixels, focusXterm, isBlack, isWhite, pollUntil } from './testing/desktop.js';
export type { DesktopSandbox, DesktopShot, PixelTest, ScreenRect } from './testing/desktop.js';
export { nodeToolkitName, writeNodeToolkitTree } from './testing/node-toolkit.js';
export { QmpScreen, KEY_DELAY_MS, MAX_SCREENSHOT_BYTES, pngSize } from './backends/qemu/screen.js';
export type { QmpScreenOptions, SandboxScreen } from './backends/qemu/screen.js';
export { NodeScreens, socketStream } from './screens.js';
