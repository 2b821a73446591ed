//! The pending overlay: the writes of the ops of one batch, held in memory until the batch
//! is written to sled as one atomic batch.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{decode, encode};
use crate::error::Result;

/// Pending writes of the ops of one batch: reads and scans see them before they reach sled,
/// then one atomic sled batch. An op that fails is rolled back to the mark taken before it.
pub(super) struct Pending<'a> {
    tree: &'a sled::Tree,
    writes: BTreeMap<Vec<u8>, Write>,
    /// Each write's key and the overlay's value before it, in write order.
    undo: Vec<(Vec<u8>, Option<Write>)>,
}

/// A pending write: a value, or `None` for a removal.
type Write = Option<Vec<u8>>;

impl<'a> Pending<'a> {
    pub(super) fn new(tree: &'a sled::Tree) -> Self {
        Pending {
            tree,
            writes: BTreeMap::new(),
            undo: Vec::new(),
        }
    }
    /// A point to roll back to.
    pub(super) fn mark(&self) -> usize {
        self.undo.len()
    }
    /// Forgets every write made since `mark`.
    pub(super) fn rollback(&mut self, mark: usize) {
        for (key, before) in self.undo.drain(mark..).rev() {
            match before {
                Some(value) => self.writes.insert(key, value),
                None => self.writes.remove(&key),
            };
        }
    }
    fn write(&mut self, key: Vec<u8>, value: Write) {
        let before = self.writes.insert(key.clone(), value);
        self.undo.push((key, before));
    }
    /// The entries whose keys start with `prefix`, the overlay's writes included.
    pub(super) fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self
            .writes
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix));
        Self::merge(self.tree.scan_prefix(prefix), overlay)
    }
    /// The first `limit` entries whose keys start with `prefix`, the overlay's writes
    /// included, reading no further into sled than that.
    pub(super) fn scan_prefix_head(
        &self,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = BTreeMap::new();
        for item in self.tree.scan_prefix(prefix) {
            if entries.len() == limit {
                break;
            }
            let (key, value) = item?;
            // A key the overlay wrote is the overlay's to decide.
            if !self.writes.contains_key(key.as_ref()) {
                entries.insert(key.to_vec(), value.to_vec());
            }
        }
        let overlay = self
            .writes
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix));
        for (key, value) in overlay {
            if let Some(value) = value {
                entries.insert(key.clone(), value.clone());
            }
        }
        Ok(entries.into_iter().take(limit).collect())
    }
    /// The entries with keys in `start..=end`, the overlay's writes included.
    pub(super) fn scan_range(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self.writes.range(start.clone()..=end.clone());
        Self::merge(self.tree.range(start..=end), overlay)
    }
    fn merge<'w>(
        stored: sled::Iter,
        overlay: impl Iterator<Item = (&'w Vec<u8>, &'w Write)>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = BTreeMap::new();
        for item in stored {
            let (key, value) = item?;
            entries.insert(key.to_vec(), value.to_vec());
        }
        for (key, value) in overlay {
            match value {
                Some(value) => entries.insert(key.clone(), value.clone()),
                None => entries.remove(key),
            };
        }
        Ok(entries.into_iter().collect())
    }
    pub(super) fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(value) = self.writes.get(key) {
            return Ok(value.clone());
        }
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }
    pub(super) fn get<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        self.get_raw(key)?.map(|bytes| decode(&bytes)).transpose()
    }
    pub(super) fn get_str(&self, key: &[u8]) -> Result<Option<String>> {
        Ok(self
            .get_raw(key)?
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }
    pub(super) fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) -> Result<()> {
        self.write(key, Some(encode(value)?));
        Ok(())
    }
    pub(super) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.write(key, Some(value));
    }
    pub(super) fn put_str(&mut self, key: Vec<u8>, value: &str) {
        self.write(key, Some(value.as_bytes().to_vec()));
    }
    pub(super) fn remove(&mut self, key: Vec<u8>) {
        self.write(key, None);
    }
    pub(super) fn into_batch(self) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (key, value) in self.writes {
            match value {
                Some(value) => batch.insert(key, value),
                None => batch.remove(key),
            }
        }
        batch
    }
}
