//! A node-local cache of what a model extracted from a text (the LLM graph extractor's
//! entities and events, ADR 0038), keyed by the model, the prompt's version and the text:
//! re-ingesting the same chunk (a re-upload, a replaced document that kept most of its text,
//! a replica rebuilt on this node) does not pay the model again. Entries are
//! `sha256(model \0 version \0 text) -> bytes` (the caller's encoding). Writes are not
//! flushed on their own: a lost entry is only asked again.

use sha2::{Digest, Sha256};

use crate::error::Result;

#[derive(Clone)]
pub struct ExtractionCache {
    tree: sled::Tree,
}

impl ExtractionCache {
    pub fn new(tree: sled::Tree) -> Self {
        ExtractionCache { tree }
    }

    fn key(model: &str, version: &str, text: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(model.as_bytes());
        hasher.update([0u8]);
        hasher.update(version.as_bytes());
        hasher.update([0u8]);
        hasher.update(text.as_bytes());
        hasher.finalize().into()
    }

    pub fn get(&self, model: &str, version: &str, text: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .tree
            .get(Self::key(model, version, text))?
            .map(|bytes| bytes.to_vec()))
    }

    pub fn put(&self, model: &str, version: &str, text: &str, value: &[u8]) -> Result<()> {
        self.tree.insert(Self::key(model, version, text), value)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_kept_per_model_version_and_text() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let cache = ExtractionCache::new(db.open_tree("extractions").unwrap());
        cache.put("m1", "v1", "Ada met Babbage", b"{}").unwrap();
        assert_eq!(
            cache.get("m1", "v1", "Ada met Babbage").unwrap(),
            Some(b"{}".to_vec())
        );
        assert_eq!(cache.get("m2", "v1", "Ada met Babbage").unwrap(), None);
        assert_eq!(cache.get("m1", "v2", "Ada met Babbage").unwrap(), None);
        assert_eq!(cache.get("m1", "v1", "Ada met Babbage.").unwrap(), None);
    }
}
