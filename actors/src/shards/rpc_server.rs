//! The shard-RPC server: what a node does with a [`ShardRpc`] from another node (the client
//! side is [`super::access::ShardAccess`]). [`SiftNode::handle_shard_rpc`] dispatches; each
//! RPC is served by one function. Every reply is a [`ShardReply`]; errors travel as
//! [`ShardReply::Failed`] with the error's code.
//!
//! Raw bytes and ingestion work (`PutRaw`, `GetRaw`, `Ingest`) need no open replica; the rest
//! is served by the local replica of the shard, opened first when this node holds one it has
//! not opened yet.

use std::sync::Arc;
use std::time::Duration;

use sift_storage::chunk::ShardWrite;
use sift_storage::meta::KbRecord;
use tracing::warn;

use super::ShardKey;
use super::error::ShardError;
use super::messages::{LeafRequest, ShardMessage};
use super::rpc::{RawDocument, ShardReply, ShardRpc};
use crate::error::{Result, SiftError};
use crate::ingest::handoff;
use crate::node::SiftNode;

fn failed(error: SiftError) -> ShardReply {
    ShardReply::Failed {
        code: error.code().to_string(),
        message: error.to_string(),
    }
}

impl SiftNode {
    /// Serves a shard request from another node.
    pub async fn handle_shard_rpc(&self, rpc: ShardRpc) -> ShardReply {
        let outcome = match rpc {
            ShardRpc::PutRaw {
                kb_id, documents, ..
            } => self.put_raw(&kb_id, documents).await,
            ShardRpc::GetRaw {
                document_id,
                upload,
                ..
            } => self.get_raw(document_id, upload).await,
            ShardRpc::Ingest {
                kb_id,
                document_ids,
                ..
            } => self.ingest(&kb_id, &document_ids).await,
            ShardRpc::Search {
                kb_id,
                shard,
                request,
            } => self.leaf_search(&kb_id, shard, request).await,
            ShardRpc::Chunks {
                kb_id,
                shard,
                document_id,
            } => self.chunks(&kb_id, shard, document_id).await,
            ShardRpc::Write {
                kb_id,
                shard,
                write,
            } => self.write(&kb_id, shard, write).await,
            ShardRpc::Delete {
                kb_id,
                shard,
                document_id,
            } => self.delete(&kb_id, shard, document_id).await,
            ShardRpc::DocumentIds { kb_id, shard } => self.document_ids(&kb_id, shard).await,
            ShardRpc::Export {
                kb_id,
                shard,
                document_ids,
            } => self.export(&kb_id, shard, document_ids).await,
            ShardRpc::Stats { kb_id, shard } => self.stats(&kb_id, shard).await,
        };
        outcome.unwrap_or_else(failed)
    }

    /// Opens this node's replicas of a KB named by a request about its raw bytes or its
    /// ingestion, so that the ingestion that follows can write.
    async fn open_replicas_of(&self, kb_id: &str) -> Result<()> {
        let kb = self.known_kb(kb_id).await?;
        if let Err(error) = self.open_shards(&kb).await {
            warn!(kb_id, %error, "opening this node's replicas failed");
        }
        Ok(())
    }

    /// `PutRaw`: stores raw documents with this replica of their shard.
    async fn put_raw(&self, kb_id: &str, documents: Vec<RawDocument>) -> Result<ShardReply> {
        self.open_replicas_of(kb_id).await?;
        self.context
            .raw
            .blocking(move |raw| raw.put_many(&documents))
            .await?;
        Ok(ShardReply::RawStored {
            queue_depth: self.queue.depth(),
        })
    }

    /// `GetRaw`: a document's raw bytes, if this node holds them.
    async fn get_raw(&self, document_id: String, upload: bool) -> Result<ShardReply> {
        let read = self
            .context
            .raw
            .blocking(move |raw| raw.get(&document_id, upload));
        read.await.map(ShardReply::Raw)
    }

    /// `Ingest`: queues documents this node was made the worker of.
    async fn ingest(&self, kb_id: &str, document_ids: &[String]) -> Result<ShardReply> {
        self.open_replicas_of(kb_id).await?;
        // The assignment was committed before the request: apply it here first.
        self.context.meta.linearizable_barrier().await?;
        handoff::queue_documents(&self.queue, kb_id, document_ids, false).await;
        Ok(ShardReply::Queued)
    }

    /// The KB of a replica request, once this node's replica of `shard` is open.
    async fn local_replica(&self, kb_id: &str, shard: u32) -> Result<KbRecord> {
        let kb = self.known_kb(kb_id).await?;
        if shard >= kb.settings.shards {
            return Err(SiftError::invalid("invalid_shard", "no such shard"));
        }
        if self.context.registry.actor(&kb.id, shard).is_none() {
            let _ = self.open_shards(&kb).await;
            if self.context.registry.actor(&kb.id, shard).is_none() {
                return Err(SiftError::ShardUnavailable {
                    kb_id: kb.id.clone(),
                    shard,
                    reason: format!("no replica on node {}", self.context.access.local_id()),
                });
            }
        }
        Ok(kb)
    }

    /// Asks the local replica of a shard (opened first if need be) and waits at most
    /// `deadline` for its answer.
    async fn ask_replica<T: Send + 'static>(
        &self,
        kb_id: &str,
        shard: u32,
        deadline: Duration,
        message: impl FnOnce(ractor::RpcReplyPort<Result<T>>) -> ShardMessage,
    ) -> Result<T> {
        let kb = self.local_replica(kb_id, shard).await?;
        self.ask_open_replica(&kb, shard, deadline, message).await
    }

    /// [`Self::ask_replica`] for a replica [`Self::local_replica`] already found.
    async fn ask_open_replica<T: Send + 'static>(
        &self,
        kb: &KbRecord,
        shard: u32,
        deadline: Duration,
        message: impl FnOnce(ractor::RpcReplyPort<Result<T>>) -> ShardMessage,
    ) -> Result<T> {
        self.context
            .access
            .local_call(&kb.id, shard, deadline, message)
            .await
            .map_err(|error| served_failure(&kb.id, shard, error))
    }

    /// `Search`: a leaf search of the local replica.
    async fn leaf_search(
        &self,
        kb_id: &str,
        shard: u32,
        request: LeafRequest,
    ) -> Result<ShardReply> {
        let request = Arc::new(request);
        let deadline = self.context.options.shard_deadline;
        self.ask_replica(kb_id, shard, deadline, |reply| ShardMessage::Search {
            request,
            reply,
        })
        .await
        .map(ShardReply::Search)
    }

    /// `Chunks`: a document's chunks from the local replica.
    async fn chunks(&self, kb_id: &str, shard: u32, document_id: String) -> Result<ShardReply> {
        let deadline = self.context.options.shard_deadline;
        self.ask_replica(kb_id, shard, deadline, |reply| ShardMessage::Chunks {
            document_id,
            reply,
        })
        .await
        .map(ShardReply::Chunks)
    }

    /// `Write`: a write applied to the local replica.
    async fn write(&self, kb_id: &str, shard: u32, write: ShardWrite) -> Result<ShardReply> {
        let kb = self.local_replica(kb_id, shard).await?;
        self.context
            .access
            .write_local(&kb.id, shard, write)
            .await
            .map(|()| ShardReply::Written)
            .map_err(|error| served_failure(&kb.id, shard, error))
    }

    /// `Delete`: a document deleted from the local replica, and its raw bytes here.
    async fn delete(&self, kb_id: &str, shard: u32, document_id: String) -> Result<ShardReply> {
        let kb = self.local_replica(kb_id, shard).await?;
        let _ = self.context.raw.remove(&document_id);
        let timeout = self.context.options.shard_write_timeout;
        self.ask_open_replica(&kb, shard, timeout, |reply| ShardMessage::Delete {
            document_id,
            reply,
        })
        .await
        .map(ShardReply::Deleted)
    }

    /// `DocumentIds`: every document id of the local replica.
    async fn document_ids(&self, kb_id: &str, shard: u32) -> Result<ShardReply> {
        let timeout = self.context.options.shard_write_timeout;
        self.ask_replica(kb_id, shard, timeout, |reply| ShardMessage::DocumentIds {
            reply,
        })
        .await
        .map(ShardReply::DocumentIds)
    }

    /// `Export`: documents of the local replica, whole, for a replica being filled.
    async fn export(
        &self,
        kb_id: &str,
        shard: u32,
        document_ids: Vec<String>,
    ) -> Result<ShardReply> {
        let timeout = self.context.options.shard_write_timeout;
        self.ask_replica(kb_id, shard, timeout, |reply| ShardMessage::Export {
            document_ids,
            reply,
        })
        .await
        .map(ShardReply::Exported)
    }

    /// `Stats`: the local replica's counts.
    async fn stats(&self, kb_id: &str, shard: u32) -> Result<ShardReply> {
        let kb = self.local_replica(kb_id, shard).await?;
        match self.context.registry.get(&ShardKey {
            kb_id: kb.id.clone(),
            shard,
        }) {
            Some(entry) => Ok(ShardReply::Stats(entry.index.stats())),
            None => Err(SiftError::Internal("replica stopped".into())),
        }
    }
}

/// The error a request served here answers with, keeping what the caller must know: a
/// missing document stays `not_found`, a failure worth retrying is `shard_unavailable`.
fn served_failure(kb_id: &str, shard: u32, error: ShardError) -> SiftError {
    if error.is_not_found() {
        return SiftError::Storage(sift_storage::StorageError::NotFound(error.to_string()));
    }
    if error.is_transient() {
        return SiftError::ShardUnavailable {
            kb_id: kb_id.to_string(),
            shard,
            reason: error.to_string(),
        };
    }
    SiftError::Internal(error.to_string())
}
