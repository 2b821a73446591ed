//! A node-local cache of embeddings keyed by model and text content.
//!
//! Embedding on CPU is the slowest stage of ingestion (about 8 abstracts per second per core
//! pair with MiniLM); re-ingesting the same text (a re-upload, a benchmark rerun, a restart
//! mid-ingestion) reuses the vectors. Entries are `sha256(model \0 text) -> f32 LE bytes`.
//! Writes are not flushed on their own: a lost entry is only recomputed.

use sha2::{Digest, Sha256};

use crate::error::Result;

#[derive(Clone)]
pub struct EmbeddingCache {
    tree: sled::Tree,
}

impl EmbeddingCache {
    pub fn new(tree: sled::Tree) -> Self {
        EmbeddingCache { tree }
    }

    fn key(model: &str, text: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(model.as_bytes());
        hasher.update([0u8]);
        hasher.update(text.as_bytes());
        hasher.finalize().into()
    }

    pub fn get(&self, model: &str, text: &str, dimension: usize) -> Result<Option<Vec<f32>>> {
        let Some(bytes) = self.tree.get(Self::key(model, text))? else {
            return Ok(None);
        };
        if bytes.len() != dimension * 4 {
            return Ok(None);
        }
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ))
    }

    pub fn put(&self, model: &str, text: &str, vector: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tree.insert(Self::key(model, text), bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_model_separation() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let cache = EmbeddingCache::new(db.open_tree("embeddings").unwrap());
        cache.put("m1", "hello", &[0.5, -0.25]).unwrap();
        assert_eq!(cache.get("m1", "hello", 2).unwrap(), Some(vec![0.5, -0.25]));
        assert_eq!(cache.get("m2", "hello", 2).unwrap(), None);
        assert_eq!(
            cache.get("m1", "hello", 3).unwrap(),
            None,
            "wrong dimension is a miss"
        );
    }
}
