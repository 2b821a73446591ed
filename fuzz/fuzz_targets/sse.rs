//! The SSE parser of the LLM clients (`models/src/llm/sse.rs`, included as it is: it depends
//! on nothing, and sift-models is too heavy to build with sanitizer coverage). The first byte
//! chooses how the stream is cut into network chunks; the events must not depend on the cuts.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../models/src/llm/sse.rs"]
#[allow(dead_code)]
mod sse;

use sse::{SseEvent, SseParser};

fn run(chunks: impl Iterator<Item = Vec<u8>>) -> (Vec<SseEvent>, usize) {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut max_buffered = 0;
    for chunk in chunks {
        events.extend(parser.push(&chunk));
        max_buffered = max_buffered.max(parser.buffered_bytes());
    }
    events.extend(parser.finish());
    (events, max_buffered)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let (whole, buffered) = run(std::iter::once(stream.to_vec()));
    let (bytewise, _) = run(stream.iter().map(|&byte| vec![byte]));
    assert_eq!(whole, bytewise, "events depend on how the stream is cut");
    let step = 1 + seed as usize % 7;
    let (stepped, _) = run(stream.chunks(step).map(<[u8]>::to_vec));
    assert_eq!(whole, stepped, "events depend on how the stream is cut");

    // Buffering is linear in what was received: lines are decoded lossily, so an invalid
    // byte costs at most 3 bytes (U+FFFD), and data lines join with one `\n` each.
    assert!(buffered <= stream.len() * 3, "{buffered} bytes buffered for {}", stream.len());
    let lines = stream.iter().filter(|&&byte| byte == b'\n' || byte == b'\r').count();
    assert!(whole.len() <= lines + 1, "more events than lines");
    for event in &whole {
        // Fields never span a line end.
        assert!(!event.event.contains(['\n', '\r']), "event name spans lines");
        assert!(!event.data.contains('\r'), "CR in event data");
    }
});
