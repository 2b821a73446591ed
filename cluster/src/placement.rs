//! Placement of documents on shards.

use sha2::{Digest, Sha256};

/// The shard of a document: the first 8 bytes of `sha256(document_id)` modulo `shards`.
/// Stable across versions, platforms and restarts (std's hasher is not).
pub fn shard_for_document(document_id: &str, shards: u32) -> u32 {
    assert!(shards > 0, "a knowledge base has at least one shard");
    let digest = Sha256::digest(document_id.as_bytes());
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(prefix) % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_balanced() {
        assert_eq!(
            shard_for_document("doc-1", 4),
            shard_for_document("doc-1", 4)
        );
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            counts[shard_for_document(&format!("doc-{i}"), 4) as usize] += 1;
        }
        for count in counts {
            assert!((800..1200).contains(&count), "unbalanced: {counts:?}");
        }
        assert_eq!(shard_for_document("anything", 1), 0);
    }
}
