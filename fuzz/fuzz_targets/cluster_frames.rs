//! The bodies of the internal API as its handlers decode them (bincode frames with their Raft
//! messages inside, proposals, join requests), through sift-cluster itself. Built only with
//! `--features cluster`: sift-cluster pulls in tantivy, sled and reqwest.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sift_cluster::transport::decode_any_body(data);
});
