// Keys of a VM's keyboard: xdotool-style key names (what computer-use agents send: `ctrl+alt+t`,
// `Return`, `Page_Down`) and typed characters on a US layout, both as QEMU key codes (qcodes,
// the names QMP's `input-send-event` takes). Pure tables, shared by the API's validation and the
// edge that sends the events.

/** One key press: the qcodes held down in order (modifiers first), released in reverse. */
export type KeyChord = readonly string[];

// Named keys (lower-cased xdotool / X keysym names and common aliases) -> qcode.
const NAMED: Readonly<Record<string, string>> = {
  ctrl: 'ctrl',
  control: 'ctrl',
  control_l: 'ctrl',
  ctrl_l: 'ctrl',
  control_r: 'ctrl_r',
  ctrl_r: 'ctrl_r',
  alt: 'alt',
  alt_l: 'alt',
  alt_r: 'alt_r',
  altgr: 'alt_r',
  shift: 'shift',
  shift_l: 'shift',
  shift_r: 'shift_r',
  super: 'meta_l',
  super_l: 'meta_l',
  super_r: 'meta_r',
  meta: 'meta_l',
  meta_l: 'meta_l',
  meta_r: 'meta_r',
  win: 'meta_l',
  cmd: 'meta_l',
  menu: 'menu',
  return: 'ret',
  enter: 'ret',
  kp_enter: 'kp_enter',
  backspace: 'backspace',
  tab: 'tab',
  escape: 'esc',
  esc: 'esc',
  space: 'spc',
  delete: 'delete',
  del: 'delete',
  insert: 'insert',
  home: 'home',
  end: 'end',
  page_up: 'pgup',
  pageup: 'pgup',
  prior: 'pgup',
  page_down: 'pgdn',
  pagedown: 'pgdn',
  next: 'pgdn',
  up: 'up',
  down: 'down',
  left: 'left',
  right: 'right',
  caps_lock: 'caps_lock',
  num_lock: 'num_lock',
  scroll_lock: 'scroll_lock',
  print: 'print',
  pause: 'pause',
  minus: 'minus',
  equal: 'equal',
  bracketleft: 'bracket_left',
  bracketright: 'bracket_right',
  backslash: 'backslash',
  semicolon: 'semicolon',
  apostrophe: 'apostrophe',
  grave: 'grave_accent',
  comma: 'comma',
  period: 'dot',
  slash: 'slash',
};
for (let i = 1; i <= 12; i++) (NAMED as Record<string, string>)[`f${i}`] = `f${i}`;

// Characters of a US layout: unshifted and shifted, by the qcode of their key.
const US_KEYS: ReadonlyArray<readonly [qcode: string, plain: string, shifted: string]> = [
  ['1', '1', '!'],
  ['2', '2', '@'],
  ['3', '3', '#'],
  ['4', '4', '$'],
  ['5', '5', '%'],
  ['6', '6', '^'],
  ['7', '7', '&'],
  ['8', '8', '*'],
  ['9', '9', '('],
  ['0', '0', ')'],
  ['minus', '-', '_'],
  ['equal', '=', '+'],
  ['bracket_left', '[', '{'],
  ['bracket_right', ']', '}'],
  ['backslash', '\\', '|'],
  ['semicolon', ';', ':'],
  ['apostrophe', "'", '"'],
  ['grave_accent', '`', '~'],
  ['comma', ',', '<'],
  ['dot', '.', '>'],
  ['slash', '/', '?'],
];

const CHARS = new Map<string, KeyChord>([
  [' ', ['spc']],
  ['\n', ['ret']],
  ['\t', ['tab']],
]);
for (const [qcode, plain, shifted] of US_KEYS) {
  CHARS.set(plain, [qcode]);
  CHARS.set(shifted, ['shift', qcode]);
}
for (let c = 0; c < 26; c++) {
  const lower = String.fromCharCode(97 + c);
  CHARS.set(lower, [lower]);
  CHARS.set(lower.toUpperCase(), ['shift', lower]);
}

/** The qcode of one key name (`ctrl`, `Return`, `a`, `F5`, `7`), or undefined when there is none. */
export function keyQcode(name: string): string | undefined {
  const n = name.toLowerCase();
  if (Object.hasOwn(NAMED, n)) return NAMED[n];
  const single = CHARS.get(name.length === 1 ? n : '');
  return single?.length === 1 ? single[0] : undefined;
}

/**
 * A chord such as `ctrl+alt+t` or `shift+Tab` as qcodes; a lone `+` is the plus key. Throws an
 * Error naming the part that is no key.
 */
export function parseKeyChord(keys: string): KeyChord {
  // A lone "+" or a chord ending in "++" (ctrl++) means the key "+" (shift+equal).
  const parts = keys === '+' ? ['+'] : keys.endsWith('++') ? [...keys.slice(0, -2).split('+'), '+'] : keys.split('+');
  const chord: string[] = [];
  for (const part of parts) {
    if (part === '') throw new Error(`${JSON.stringify(keys)} has an empty key name`);
    const qcode = keyQcode(part);
    if (qcode !== undefined) {
      chord.push(qcode);
      continue;
    }
    const typed = part.length === 1 ? CHARS.get(part) : undefined;
    if (!typed) throw new Error(`${JSON.stringify(part)} is no key name`);
    chord.push(...typed);
  }
  return chord;
}

/** The key presses that type `text` on a US layout, or the index of the first character that has no key. */
export function textChords(text: string): { chords: KeyChord[] } | { badIndex: number; char: string } {
  const chords: KeyChord[] = [];
  let i = 0;
  for (const ch of text) {
    const chord = CHARS.get(ch === '\r' ? '\n' : ch);
    if (!chord) return { badIndex: i, char: ch };
    chords.push(chord);
    i++;
  }
  return { chords };
}
