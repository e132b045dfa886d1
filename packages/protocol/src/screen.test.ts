import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { DsecError } from './errors.js';
import { FakeEdge } from './edge-wire/fake-edge.js';
import { loopbackEdge } from './edge-wire/loopback.js';
import { parseOrThrow } from './parse.js';
import { ScreenInputRequestSchema, actionPoints } from './screen.js';
import { keyQcode, parseKeyChord, textChords } from './screen-keys.js';

describe('keys of a VM keyboard', () => {
  test('xdotool names and chords become qcodes, modifiers first', () => {
    assert.deepEqual(parseKeyChord('ctrl+alt+t'), ['ctrl', 'alt', 't']);
    assert.deepEqual(parseKeyChord('Return'), ['ret']);
    assert.deepEqual(parseKeyChord('shift+Tab'), ['shift', 'tab']);
    assert.deepEqual(parseKeyChord('Page_Down'), ['pgdn']);
    assert.deepEqual(parseKeyChord('super+F5'), ['meta_l', 'f5']);
    assert.deepEqual(parseKeyChord('+'), ['shift', 'equal']);
    assert.deepEqual(parseKeyChord('ctrl++'), ['ctrl', 'shift', 'equal']);
    assert.deepEqual(parseKeyChord('A'), ['a']);
    assert.equal(keyQcode('BackSpace'), 'backspace');
    assert.throws(() => parseKeyChord('ctrl+hyper'), /"hyper" is no key name/);
    assert.throws(() => parseKeyChord('ctrl+'), /empty key name/);
  });

  test('text on a US layout, shift where needed; the first character without a key is named', () => {
    const r = textChords('aZ!\n ~');
    assert.ok('chords' in r);
    assert.deepEqual(r.chords, [['a'], ['shift', 'z'], ['shift', '1'], ['ret'], ['spc'], ['shift', 'grave_accent']]);
    assert.deepEqual(textChords('ok €'), { badIndex: 3, char: '€' });
    // Index in characters, not UTF-16 units.
    assert.deepEqual(textChords('😀é'), { badIndex: 0, char: '😀' });
  });
});

describe('input requests', () => {
  const field = (body: unknown): string | undefined => {
    try {
      parseOrThrow(ScreenInputRequestSchema, body);
      return undefined;
    } catch (err) {
      return (err as DsecError).details.field;
    }
  };

  test('each bad action is refused naming its field', () => {
    assert.equal(field({ actions: [{ action: 'left_click', x: 1, y: 2 }] }), undefined);
    assert.equal(field({ actions: [] }), 'actions');
    assert.equal(field({ actions: [{ action: 'left_click', x: 1.5, y: 2 }] }), 'actions.0.x');
    assert.equal(
      field({
        actions: [
          { action: 'wait', ms: 10 },
          { action: 'wait', ms: 60_000 },
        ],
      }),
      'actions.1.ms',
    );
    assert.equal(field({ actions: [{ action: 'key', keys: 'nope' }] }), 'actions.0.keys');
    assert.equal(field({ actions: [{ action: 'drag', path: [{ x: 1, y: 1 }] }] }), 'actions.0.path');
    assert.equal(field({ actions: [{ action: 'left_click', x: 1, y: 2, z: 3 }] }), 'actions.0.z');
    assert.equal(field({ actions: Array(201).fill({ action: 'wait', ms: 0 }) }), 'actions');
    const waits = Array(4).fill({ action: 'wait', ms: 9000 });
    assert.equal(field({ actions: waits }), 'actions.3.ms', 'the waits of one request together are bounded');
    assert.equal(
      field({
        actions: [
          { action: 'type', text: 'x'.repeat(3000) },
          { action: 'type', text: 'y'.repeat(2000) },
        ],
      }),
      'actions.1.text',
    );
  });

  test('the points of each action name their fields', () => {
    assert.deepEqual(
      actionPoints({
        action: 'drag',
        path: [
          { x: 1, y: 2 },
          { x: 3, y: 4 },
        ],
      }).map((p) => p.field),
      ['path.0', 'path.1'],
    );
    assert.deepEqual(actionPoints({ action: 'type', text: 'x' }), []);
  });
});

describe('screens over the edge wire', () => {
  test('capture, input and a VNC stream cross the wire; errors keep their code', async () => {
    const client = await loopbackEdge(new FakeEdge());
    try {
      const shot = await client.screen.capture('sb-1');
      assert.deepEqual([...shot.png], [0x89, 0x50, 0x4e, 0x47]);
      assert.deepEqual([shot.width, shot.height], [2, 1]);
      assert.deepEqual(await client.screen.input('sb-1', [{ action: 'key', keys: 'a' }]), { performed: 1, width: 2, height: 1 });
      await assert.rejects(client.screen.capture('no-screen'), (err: DsecError) => err.code === 'CONFLICT');
      // The wire checks the actions again on the serving side.
      await assert.rejects(
        client.screen.input('sb-1', [{ action: 'type', text: '€' }]),
        (err: DsecError) => err.code === 'INVALID_ARGUMENT' && err.details.field === 'actions.0.text',
      );
      const vnc = await client.screen.connect('sb-1');
      await vnc.write(new Uint8Array([1, 2, 3]));
      const got: string[] = [];
      for await (const ev of vnc) if (ev.kind === 'data') got.push(Buffer.from(ev.data).toString());
      assert.deepEqual(got, ['line 0\n', 'line 1\n']);
    } finally {
      client.close();
    }
  });
});
