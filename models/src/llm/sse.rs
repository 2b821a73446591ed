//! An incremental parser for Server-Sent Events (the `text/event-stream` format).
//!
//! Bytes are fed as they arrive from the network; a line may be split across any number of TCP
//! chunks (even inside a UTF-8 sequence). An event is dispatched at a blank line: its `data:`
//! lines joined with `\n`, with the `event:` name if one was given. Comment lines (`:` first),
//! `id:` and `retry:` fields and unknown fields are ignored. `\n`, `\r\n` and `\r` all end a
//! line.

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, empty when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Turns a byte stream into [`SseEvent`]s.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous byte was a `\r` (a following `\n` belongs to the same line end).
    after_carriage_return: bool,
    event: String,
    data: String,
    /// At least one `data:` field was seen since the last dispatch.
    has_data: bool,
}

impl SseParser {
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds the next bytes; returns the events they completed, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in bytes {
            if self.after_carriage_return {
                self.after_carriage_return = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' => self.end_line(&mut events),
                b'\r' => {
                    self.after_carriage_return = true;
                    self.end_line(&mut events);
                }
                _ => self.line.push(byte),
            }
        }
        events
    }

    /// Bytes held for the event being assembled (to bound what a misbehaving server can make
    /// the client buffer).
    pub fn buffered_bytes(&self) -> usize {
        self.line.len() + self.data.len()
    }

    /// The event still pending when the stream ended without a final blank line (servers that
    /// close right after their last `data:` line), if any.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.dispatch(&mut events);
        events.pop()
    }

    fn end_line(&mut self, events: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = value.to_owned(),
            _ => {}
        }
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if !self.has_data {
            return;
        }
        self.has_data = false;
        events.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &str, piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for chunk in input.as_bytes().chunks(piece) {
            events.extend(parser.push(chunk));
        }
        events.extend(parser.finish());
        events
    }

    #[test]
    fn events_survive_any_chunking() {
        let input = ": keep-alive\n\nevent: message_start\ndata: {\"a\":\"é\"}\n\n\
                     data: first\ndata: second\r\n\r\nid: 7\nretry: 10\ndata:[DONE]\n\n";
        let expected = vec![
            SseEvent {
                event: "message_start".to_owned(),
                data: "{\"a\":\"é\"}".to_owned(),
            },
            SseEvent {
                event: String::new(),
                data: "first\nsecond".to_owned(),
            },
            SseEvent {
                event: String::new(),
                data: "[DONE]".to_owned(),
            },
        ];
        for piece in 1..=input.len() {
            assert_eq!(
                parse_in_pieces(input, piece),
                expected,
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn carriage_returns_alone_end_lines() {
        assert_eq!(
            parse_in_pieces("data: x\r\rdata: y\r\r", 1),
            vec![
                SseEvent {
                    event: String::new(),
                    data: "x".to_owned()
                },
                SseEvent {
                    event: String::new(),
                    data: "y".to_owned()
                },
            ]
        );
    }

    #[test]
    fn unterminated_last_event_is_returned_by_finish() {
        let mut parser = SseParser::new();
        assert!(parser.push(b"data: tail").is_empty());
        assert_eq!(
            parser.finish(),
            Some(SseEvent {
                event: String::new(),
                data: "tail".to_owned()
            })
        );
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn buffered_bytes_count_the_unfinished_event() {
        let mut parser = SseParser::new();
        parser.push(b"data: 12345\ndata: 678");
        assert_eq!(parser.buffered_bytes(), "12345".len() + "data: 678".len());
        parser.push(b"\n\n");
        assert_eq!(parser.buffered_bytes(), 0);
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert!(parse_in_pieces("event: ping\n\n: comment\n\n", 3).is_empty());
    }
}
