// Line-by-line JSON reader for `application/x-ndjson` replies.

/** Yields one parsed value per non-empty line of a byte stream. */
export async function* readNdjson<T = unknown>(stream: AsyncIterable<Buffer | string>): AsyncGenerator<T> {
  let pending = '';
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    pending += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, nl).trim();
      pending = pending.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
  pending += decoder.decode();
  const last = pending.trim();
  if (last) yield JSON.parse(last) as T;
}
