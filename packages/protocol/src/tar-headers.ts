// Bounds on the extended headers of untrusted tars (PAX records, GNU long names), shared by every
// extractor of tars a tenant sends (the node's layer extractor, the apiserver's directory upload).
// tar-stream holds each extended header whole in memory (up to its own 4 MiB) and copies a global
// PAX header's records into each later entry that has its own PAX header; these bounds keep both small.

/** Bytes of extended headers (and padding) in front of one tar entry. */
export const MAX_TAR_EXTENDED_HEADER_BYTES = 1024 * 1024;
/** PAX records (the global header's and the entry's own together) one tar entry may carry. */
export const MAX_TAR_PAX_RECORDS = 1000;

/**
 * Bytes a tar stream may run past the end of its last entry's data with no next entry yet: the
 * extended headers' bound, the next entry's own header block, and what the streams on the way
 * buffer (a few chunks; 1 MiB is ample). Past it the stream is a run of extended headers that
 * never reaches an entry (each one under tar-stream's own cap, so only this bound stops it).
 */
export const MAX_TAR_BYTES_BETWEEN_ENTRIES = MAX_TAR_EXTENDED_HEADER_BYTES + 512 + 1024 * 1024;

/**
 * Why a tar stream that has handed `consumed` bytes to the parser, its last entry's data ending at
 * `lastEnd`, is refused, or undefined. Checked before each chunk is handed on (so the parser holds
 * at most the bound and one chunk).
 */
export function tarBytesBetweenEntriesFault(consumed: number, lastEnd: number): string | undefined {
  if (consumed - lastEnd <= MAX_TAR_BYTES_BETWEEN_ENTRIES) return undefined;
  return `PAX extended headers over ${MAX_TAR_EXTENDED_HEADER_BYTES} bytes with no tar entry after them (${consumed - lastEnd} bytes past the last entry)`;
}

/** What tar-stream reports for one extended header over its own 4 MiB cap. */
const TAR_STREAM_HEADER_OVERFLOW = 'Header exceeds max size';

/** The parts of a tar-stream entry header the bounds read. */
export interface TarEntryHeader {
  name: string;
  /** Offset of the entry's data: its own 512-byte header block ends there. */
  byteOffset?: number;
  /** The entry's PAX records (tar-stream's `header.pax`). */
  pax?: unknown;
}

/**
 * Why the extended headers in front of an entry are refused (a message naming the PAX header and
 * its bound), or undefined. `previousEnd` is where the previous entry's data (padded) ended.
 */
export function tarExtendedHeaderFault(header: TarEntryHeader, previousEnd: number): string | undefined {
  const extendedBytes = (header.byteOffset ?? 0) - 512 - previousEnd;
  const entry = JSON.stringify(header.name.slice(0, 256));
  if (extendedBytes > MAX_TAR_EXTENDED_HEADER_BYTES) {
    return `PAX extended header of tar entry ${entry} is ${extendedBytes} bytes, over ${MAX_TAR_EXTENDED_HEADER_BYTES}`;
  }
  const records = header.pax && typeof header.pax === 'object' ? Object.keys(header.pax).length : 0;
  if (records > MAX_TAR_PAX_RECORDS) return `PAX extended header of tar entry ${entry} has ${records} records, over ${MAX_TAR_PAX_RECORDS}`;
  return undefined;
}

/** The refusal's message when tar-stream itself stopped at an extended header over its own cap, or undefined. */
export function tarHeaderOverflowFault(err: unknown): string | undefined {
  if (!(err instanceof Error) || err.message !== TAR_STREAM_HEADER_OVERFLOW) return undefined;
  return `PAX extended header over ${MAX_TAR_EXTENDED_HEADER_BYTES} bytes`;
}
