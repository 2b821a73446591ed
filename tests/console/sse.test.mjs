// The console's event-stream parser (node/console/sse.js) on the wire's corner cases: events
// split anywhere between reads, CRLF and CR line ends, several data lines, comments, an id
// kept across events (what a resume sends as Last-Event-ID). Run by scripts/console-e2e.sh
// with `node --test`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SseParser } from '../../node/console/sse.js';

function feedAll(pieces) {
  const parser = new SseParser();
  const events = pieces.flatMap((piece) => parser.feed(piece));
  return { parser, events };
}

test('events split at every byte read the same as whole', () => {
  const wire = 'id: 1\nevent: meta\ndata: {"run_id":"r"}\n\nid: 2\nevent: delta\ndata: {"text":"a"}\n\n';
  const whole = feedAll([wire]).events;
  const bytes = feedAll([...wire]).events;
  assert.deepEqual(bytes, whole);
  assert.deepEqual(whole.map((event) => [event.id, event.event]), [['1', 'meta'], ['2', 'delta']]);
});

test('CRLF and CR line ends, a CRLF split between reads', () => {
  const { events } = feedAll(['event: a\r\ndata: 1\r', '\n\r\nevent: b\rdata: 2\r\r']);
  assert.deepEqual(events.map((event) => [event.event, event.data]), [['a', '1'], ['b', '2']]);
});

test('several data lines are joined by newlines; comments and unknown fields are skipped', () => {
  const { events } = feedAll([': keep-alive\n\ndata: one\ndata:two\nretry: 10\nfoo: bar\n\n']);
  assert.equal(events.length, 1);
  assert.equal(events[0].event, 'message');
  assert.equal(events[0].data, 'one\ntwo');
});

test('the last id stays for the events after it and for a resume', () => {
  const { parser, events } = feedAll(['id: 7\ndata: x\n\ndata: y\n\n']);
  assert.deepEqual(events.map((event) => event.id), ['7', '7']);
  assert.equal(parser.lastEventId, '7');
});

test('an event without data is not dispatched; an unfinished one waits', () => {
  const { events } = feedAll(['event: nothing\n\n', 'data: half']);
  assert.equal(events.length, 0);
});

test('CRLF events read a character at a time', () => {
  const wire = 'id: 3\r\nevent: citation\r\ndata: {"n":1}\r\n\r\nid: 4\r\nevent: done\r\ndata: {}\r\n\r\n';
  const { events } = feedAll([...wire]);
  assert.deepEqual(events.map((event) => [event.id, event.event, event.data]), [
    ['3', 'citation', '{"n":1}'],
    ['4', 'done', '{}'],
  ]);
});
