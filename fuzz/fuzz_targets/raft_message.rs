//! Raft messages as peers send them (`Message::parse_from_bytes` in
//! `cluster/src/transport.rs`) and the records the Raft storage reads back (`Entry`,
//! `HardState`, `ConfState`, `Snapshot`): rust-protobuf 2 decoding never panics or overflows
//! the stack, and what it decodes re-encodes to bytes that decode to the same fields (unknown
//! fields aside: rust-protobuf 2's `PartialEq` tells an emptied unknown-field map from none,
//! and it writes unknown fields in hash-map order; the first runs of this target found both).
//! The first byte picks the message type.
#![no_main]

use libfuzzer_sys::fuzz_target;
use raft::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};

fn round_trip<M: protobuf::Message>(bytes: &[u8]) {
    let Ok(message) = M::parse_from_bytes(bytes) else {
        return;
    };
    let encoded = message.write_to_bytes().expect("a decoded message encodes");
    let again = M::parse_from_bytes(&encoded).expect("an encoded message decodes");
    // The text format shows every known field and no unknown one.
    assert_eq!(
        protobuf::text_format::print_to_string(&message),
        protobuf::text_format::print_to_string(&again),
        "re-encoding changed the message"
    );
    // Unknown fields are kept in a hash map, so only the size is stable, not the order.
    let encoded_again = again.write_to_bytes().expect("a decoded message encodes");
    assert_eq!(encoded.len(), encoded_again.len(), "re-encoding changed the size");
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 5 {
        0 => round_trip::<Message>(bytes),
        1 => round_trip::<Entry>(bytes),
        2 => round_trip::<HardState>(bytes),
        3 => round_trip::<ConfState>(bytes),
        _ => round_trip::<Snapshot>(bytes),
    }
});
