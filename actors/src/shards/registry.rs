//! The live map of shard replicas on this node, shared by the supervisor (writes) and the
//! search root and ingestion (reads). Never held across an `.await`: readers clone the entry.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ractor::ActorRef;
use sift_storage::shard::ShardIndex;

use super::messages::ShardMessage;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    pub kb_id: String,
    pub shard: u32,
}

#[derive(Clone)]
pub struct ShardEntry {
    pub actor: ActorRef<ShardMessage>,
    pub index: Arc<ShardIndex>,
}

#[derive(Clone, Default)]
pub struct ShardRegistry {
    entries: Arc<RwLock<HashMap<ShardKey, ShardEntry>>>,
}

impl ShardRegistry {
    pub fn get(&self, key: &ShardKey) -> Option<ShardEntry> {
        self.read().get(key).cloned()
    }

    pub fn actor(&self, kb_id: &str, shard: u32) -> Option<ActorRef<ShardMessage>> {
        self.get(&ShardKey {
            kb_id: kb_id.to_string(),
            shard,
        })
        .map(|entry| entry.actor)
    }

    pub fn insert(&self, key: ShardKey, entry: ShardEntry) {
        self.write().insert(key, entry);
    }

    pub fn remove(&self, key: &ShardKey) -> Option<ShardEntry> {
        self.write().remove(key)
    }

    pub fn keys(&self) -> Vec<ShardKey> {
        self.read().keys().cloned().collect()
    }

    pub fn keys_of(&self, kb_id: &str) -> Vec<ShardKey> {
        self.read()
            .keys()
            .filter(|key| key.kb_id == kb_id)
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ShardKey, ShardEntry>> {
        self.entries
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ShardKey, ShardEntry>> {
        self.entries
            .write()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}
