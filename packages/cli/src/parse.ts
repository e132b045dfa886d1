// Option value parsers for commander; a bad value is a usage error (exit 2).
import { InvalidArgumentError } from 'commander';

/** Collects a repeated `k=v` option into a record. */
export function keyValue(value: string, previous: Record<string, string> = {}): Record<string, string> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError(`expected key=value, got "${value}"`);
  return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) };
}

/** Collects a repeated option into a list. */
export function repeated(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** A number (integer when `integer`), refusing garbage. */
export function number(integer: boolean): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || (integer && !Number.isInteger(n)))
      throw new InvalidArgumentError(`not ${integer ? 'an integer' : 'a number'}: "${value}"`);
    return n;
  };
}

/** A comma-separated list. */
export function commaList(value: string): string[] {
  return value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}
