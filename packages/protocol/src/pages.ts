// Listings: page sizes and the shape of a page.
import { z } from 'zod';

/** Default and largest page of a listing. */
export const DEFAULT_PAGE_SIZE = 100;

export const MAX_PAGE_SIZE = 1000;

/** A page of a listing. */
export function pageOf<T extends z.ZodType>(item: T) {
  return z.object({ items: z.array(item), nextCursor: z.string().nullable() });
}
