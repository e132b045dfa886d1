export { Watcher, DEFAULT_WATCH_INTERVAL_MS } from './watcher.js';
export type { WatchedNode, WatchedSandbox, WatcherOptions, WatcherTarget } from './watcher.js';
