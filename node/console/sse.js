// Server-sent events over fetch: EventSource cannot send an Authorization header, so the
// console reads `text/event-stream` itself (the WHATWG parsing rules: `id`, `event`, `data`
// lines, several `data` lines joined by newlines, comments and `retry` ignored).

/** Parses an event stream fed in pieces of text; `feed` returns the events completed. */
export class SseParser {
  constructor() {
    this.buffer = '';
    this.afterCr = false;
    this.reset();
    this.lastEventId = '';
  }

  reset() {
    this.event = '';
    this.data = [];
    this.hasData = false;
  }

  feed(text) {
    // a \r that ended the last piece ended a line: a \n starting this one is its other half
    if (this.afterCr && text.startsWith('\n')) text = text.slice(1);
    this.afterCr = false;
    this.buffer += text;
    const events = [];
    let newline;
    while ((newline = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, newline);
      const width = this.buffer.startsWith('\r\n', newline) ? 2 : 1;
      if (width === 1 && this.buffer[newline] === '\r' && newline === this.buffer.length - 1) {
        this.afterCr = true;
      }
      this.buffer = this.buffer.slice(newline + width);
      const event = this.line(line);
      if (event) events.push(event);
    }
    return events;
  }

  line(line) {
    if (line === '') {
      if (!this.hasData) {
        this.reset();
        return null;
      }
      const event = {
        event: this.event || 'message',
        data: this.data.join('\n'),
        id: this.lastEventId,
      };
      this.reset();
      return event;
    }
    if (line.startsWith(':')) return null;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') {
      this.data.push(value);
      this.hasData = true;
    } else if (field === 'id' && !value.includes('\0')) this.lastEventId = value;
    return null;
  }
}

/**
 * Reads an event stream from a fetch Response, calling `onEvent({event, data, id})` for
 * each event (data parsed as JSON when it is). Resolves with the last event id when the
 * stream ends.
 */
export async function readEvents(response, onEvent, signal) {
  const parser = new SseParser();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener('abort', abort);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const event of parser.feed(value)) {
        let data = event.data;
        try {
          data = JSON.parse(event.data);
        } catch {
          // not JSON: pass the text on
        }
        onEvent({ event: event.event, data, id: event.id });
      }
    }
  } finally {
    signal?.removeEventListener('abort', abort);
  }
  return parser.lastEventId;
}
