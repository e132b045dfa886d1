// Sortable ids for events and audit entries: creation order within a process is id order, and
// ids of several processes interleave by time.
import { randomBytes } from 'node:crypto';

/** Distinguishes processes (apiserver replicas) that make ids in the same millisecond. */
const PROCESS_TAG = randomBytes(3).toString('hex');
let lastMs = 0;
let seq = 0;

/** `<prefix>_<13-digit ms><5-digit sequence><6 hex>`: lexical order is creation order. */
export function sortableId(prefix: string): string {
  // Never backwards, even when the wall clock is set back.
  const now = Math.max(Date.now(), lastMs);
  if (now === lastMs) seq++;
  else seq = 0;
  lastMs = now;
  if (seq > 99_999) {
    lastMs++;
    seq = 0;
  }
  return `${prefix}_${String(lastMs).padStart(13, '0')}${String(seq).padStart(5, '0')}${PROCESS_TAG}`;
}

/** True when `id` could have come from {@link sortableId} with `prefix`. */
export function isSortableId(prefix: string, id: string): boolean {
  return new RegExp(`^${prefix}_\\d{18}[0-9a-f]{6}$`).test(id);
}
