export { DsecError, ERROR_STATUS, invalidArgument, isDsecError } from './errors.js';
export type { ErrorCode, ErrorDetails } from './errors.js';
export * from './types.js';
export * from './api.js';
export * from './events.js';
export * from './syscalls.js';
export * from './watch.js';
export * from './network.js';
