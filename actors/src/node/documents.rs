//! Documents: bulk texts and uploads are checked, stored raw (durable) and registered in one
//! metadata op, then queued for ingestion; reads, chunk listing and deletes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use sift_api::documents::{AddedDocument, NewTextDocument};
use sift_cluster::placement::shard_for_document;
use sift_storage::chunk::{ACCESS_GROUPS_KEY, ChunkView, Metadata};
use sift_storage::meta::{DocSource, DocStatus, DocumentRecord, KbRecord, MetaOp, MetaOutcome};

use super::SiftNode;
use crate::error::{Result, SiftError};
use crate::ingest::handoff::{self, JOB_DOCUMENTS};
use crate::ingest::image::check_image;
use crate::ingest::parse::{SourceFormat, parse_document};
use crate::ingest::pipeline::{self, now_ms};
use crate::ingest::queue::IngestJob;
use crate::scope::{Need, Scope, check_groups};

/// An upload already streamed to a temp file by the HTTP layer.
#[derive(Clone, Debug)]
pub struct Upload {
    pub temp_path: PathBuf,
    pub file_name: String,
    /// The `Content-Type` of the file's part, if the client sent one: the format of a file
    /// whose name has no known extension (`application/pdf`).
    pub media_type: Option<String>,
    pub external_id: Option<String>,
    pub size_bytes: u64,
    /// sha256 of the bytes, hex.
    pub content_hash: String,
    pub metadata: Metadata,
    /// The groups that may read it (the `access` field); empty: everyone.
    pub groups: Vec<String>,
    /// The format when it is already known (sniffed from a fetched URL's bytes); else the
    /// file name's extension, then `media_type`, decide.
    pub format: Option<SourceFormat>,
}

impl SiftNode {
    /// Registers bulk texts and queues them. All-or-nothing validation: one bad document
    /// rejects the request and stores nothing.
    pub async fn add_texts(
        &self,
        scope: &Scope,
        kb: &str,
        documents: Vec<NewTextDocument>,
    ) -> Result<Vec<AddedDocument>> {
        let kb = self.find_kb_for_data(scope, kb, Need::Write).await?;
        if documents.is_empty() {
            return Err(SiftError::invalid("empty_request", "documents is empty"));
        }
        let mut records = Vec::with_capacity(documents.len());
        let mut texts = Vec::with_capacity(documents.len());
        let now = now_ms();
        for (position, document) in documents.into_iter().enumerate() {
            if document.text.trim().is_empty() {
                return Err(SiftError::Unprocessable {
                    code: "empty_document",
                    message: format!("documents[{position}] has no text"),
                });
            }
            let format = document.format.unwrap_or_else(|| "text".into());
            if !matches!(format.as_str(), "text" | "markdown" | "md" | "html") {
                return Err(SiftError::invalid(
                    "unsupported_type",
                    format!("documents[{position}].format must be text, markdown or html"),
                ));
            }
            validate_external_id(document.external_id.as_deref())?;
            let mut metadata = metadata_from_json(document.metadata.unwrap_or_default())?;
            let groups = match &document.access {
                Some(access) => check_groups(&access.groups)?,
                None => Vec::new(),
            };
            set_access(&mut metadata, &groups);
            let id = uuid::Uuid::now_v7().to_string();
            let mut hasher = Sha256::new();
            // The same text for other readers is another document, not a duplicate.
            hasher.update(groups.join(",").as_bytes());
            hasher.update([0]);
            hasher.update(format.as_bytes());
            hasher.update([0]);
            hasher.update(document.title.as_deref().unwrap_or("").as_bytes());
            hasher.update([0]);
            hasher.update(document.text.as_bytes());
            records.push(DocumentRecord {
                shard: shard_for_document(
                    routing_key(document.external_id.as_deref(), &id),
                    kb.settings.shards,
                ),
                id,
                kb_id: kb.id.clone(),
                title: document
                    .title
                    .or_else(|| document.external_id.clone())
                    .unwrap_or_default(),
                external_id: document.external_id,
                source: DocSource::Text { format },
                content_hash: hex::encode(hasher.finalize()),
                size_bytes: document.text.len() as u64,
                status: DocStatus::Queued,
                error: None,
                chunk_count: 0,
                metadata,
                created_at_ms: now,
                updated_at_ms: now,
                pages_needing_ocr: 0,
            });
            texts.push(document.text);
        }
        let _reserved = self.reserve_quota(&kb, &records)?;
        // Raw texts first (durable), then the metadata op that makes them documents.
        let raw = self.context.raw.clone();
        let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (id, text) in ids.iter().zip(&texts) {
                raw.put_text(id, text)?;
            }
            raw.flush()
        })
        .await
        .map_err(|e| SiftError::Internal(e.to_string()))??;
        self.register(&kb, records).await
    }

    /// Validates an uploaded file (type, size, decodable text), then registers and queues it.
    /// Invalid files are refused before anything is stored.
    pub async fn add_upload(
        &self,
        scope: &Scope,
        kb: &str,
        upload: Upload,
    ) -> Result<AddedDocument> {
        let mut added = self.add_uploads(scope, kb, vec![upload]).await?;
        added
            .pop()
            .ok_or_else(|| SiftError::Internal("registration returned nothing".into()))
    }

    /// Validates files already in the upload directory (uploads, fetched URLs), then
    /// registers and queues them together. All or nothing: one invalid file refuses them all
    /// and stores nothing. The caller removes the temp files that were not adopted.
    pub async fn add_uploads(
        &self,
        scope: &Scope,
        kb: &str,
        uploads: Vec<Upload>,
    ) -> Result<Vec<AddedDocument>> {
        let kb = self.find_kb_for_data(scope, kb, Need::Write).await?;
        let mut options = pipeline::parse_options(&kb, &self.context.options);
        if self
            .context
            .options
            .ocr
            .engine_for(&kb.settings.ocr)
            .is_ok()
        {
            // A PDF of scanned pages is for the OCR engine to read.
            options.pdf.scanned = crate::ingest::pdf::Scanned::Accept;
        }
        let mut records = Vec::with_capacity(uploads.len());
        for upload in &uploads {
            let format = upload
                .format
                .or_else(|| SourceFormat::from_file_name(&upload.file_name))
                .or_else(|| {
                    upload
                        .media_type
                        .as_deref()
                        .and_then(SourceFormat::from_media_type)
                })
                .ok_or_else(|| unsupported_upload(upload))?;
            validate_external_id(upload.external_id.as_deref())?;
            let groups = check_groups(&upload.groups)?;
            let mut metadata = upload.metadata.clone();
            set_access(&mut metadata, &groups);
            let temp = upload.temp_path.clone();
            let parse_options = options.clone();
            let parsed = tokio::task::spawn_blocking(move || -> Result<Option<String>> {
                let bytes = std::fs::read(&temp).map_err(|e| SiftError::Storage(e.into()))?;
                if format == SourceFormat::Image {
                    check_image(&bytes, &parse_options.image)?;
                    return Ok(None);
                }
                if crate::ingest::office::streams_records(format) {
                    // Read through without keeping its text: it may be too large to hold
                    // parsed whole (a spreadsheet has no title either).
                    crate::ingest::office::stream_records(
                        &bytes,
                        format,
                        &parse_options.office,
                        pipeline::RUN_BYTES,
                        &mut |_| Ok(()),
                    )?;
                    return Ok(None);
                }
                let parsed = parse_document(&bytes, format, &parse_options)?;
                Ok(parsed.title)
            })
            .await
            .map_err(|e| SiftError::Internal(e.to_string()))??;
            if format == SourceFormat::Image {
                // Its text needs an engine: refused now rather than failed later.
                self.context.options.ocr.engine_for(&kb.settings.ocr)?;
            }
            let id = uuid::Uuid::now_v7().to_string();
            let now = now_ms();
            records.push(DocumentRecord {
                shard: shard_for_document(
                    routing_key(upload.external_id.as_deref(), &id),
                    kb.settings.shards,
                ),
                id,
                kb_id: kb.id.clone(),
                external_id: upload.external_id.clone(),
                title: parsed.unwrap_or_else(|| upload.file_name.clone()),
                source: DocSource::Upload {
                    file_name: upload.file_name.clone(),
                    format: format.as_str().to_string(),
                },
                content_hash: access_hash(&upload.content_hash, &groups),
                size_bytes: upload.size_bytes,
                status: DocStatus::Queued,
                error: None,
                chunk_count: 0,
                metadata,
                created_at_ms: now,
                updated_at_ms: now,
                pages_needing_ocr: 0,
            });
        }
        let _reserved = self.reserve_quota(&kb, &records)?;
        // Bytes in place (durable) before the metadata op that makes them documents.
        let raw = self.context.raw.clone();
        let moves: Vec<(PathBuf, String)> = uploads
            .iter()
            .zip(&records)
            .map(|(upload, record)| (upload.temp_path.clone(), record.id.clone()))
            .collect();
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (done, (temp, id)) in moves.iter().enumerate() {
                if let Err(error) = raw.adopt_file(temp, id) {
                    for (_, adopted) in &moves[..done] {
                        let _ = raw.remove(adopted);
                    }
                    return Err(error);
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| SiftError::Internal(e.to_string()))??;
        self.register(&kb, records).await
    }

    async fn register(
        &self,
        kb: &KbRecord,
        records: Vec<DocumentRecord>,
    ) -> Result<Vec<AddedDocument>> {
        let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        let local = self.context.access.local_id();
        // The raw bytes with the shards' replicas (cluster mode), and a worker per document.
        let workers =
            match handoff::store_with_replicas(&self.context, &self.queue, kb, &records).await {
                Ok(workers) => workers,
                Err(error) => {
                    for id in &ids {
                        let _ = self.context.raw.remove(id);
                    }
                    return Err(error);
                }
            };
        // Admission: room for every local job is reserved before anything is registered; if
        // the queue is full nothing is registered and the raw data goes.
        let local_ids: Vec<String> = ids
            .iter()
            .zip(&workers)
            .filter(|(_, worker)| **worker == local)
            .map(|(id, _)| id.clone())
            .collect();
        let jobs: Vec<IngestJob> = local_ids
            .chunks(JOB_DOCUMENTS)
            .map(|batch| IngestJob {
                kb_id: kb.id.clone(),
                document_ids: batch.to_vec(),
                retries: 0,
            })
            .collect();
        let permits = match self.queue.try_reserve(jobs.len()) {
            Ok(permits) => permits,
            Err(error) => {
                for id in &ids {
                    let _ = self.context.raw.remove(id);
                }
                return Err(error);
            }
        };
        let assignments: Vec<(u64, u32, String)> = records
            .iter()
            .zip(&workers)
            .map(|(record, worker)| (*worker, record.shard, record.id.clone()))
            .collect();
        let proposed = self
            .context
            .meta
            .propose(MetaOp::RegisterDocumentsTo {
                kb_id: kb.id.clone(),
                documents: records,
                workers,
            })
            .await;
        let outcome = match proposed {
            Ok(outcome) => outcome,
            Err(error) => {
                for id in &ids {
                    let _ = self.context.raw.remove(id);
                }
                return Err(error);
            }
        };
        let MetaOutcome::Registered(registered) = outcome else {
            return Err(SiftError::Internal(format!(
                "unexpected outcome {outcome:?}"
            )));
        };
        let mut added = Vec::with_capacity(registered.len());
        for (entry, submitted_id) in registered.into_iter().zip(&ids) {
            if entry.duplicate {
                let _ = self.context.raw.remove(submitted_id);
            }
            if let Some(old) = &entry.replaced {
                self.context
                    .access
                    .delete(kb, old.shard, &old.document_id)
                    .await;
                let _ = self.context.raw.remove(&old.document_id);
            }
            added.push(AddedDocument {
                id: entry.record.id.clone(),
                external_id: entry.record.external_id.clone(),
                status: entry.record.status.as_str().to_string(),
                duplicate: entry.duplicate,
                replaced: entry.replaced.map(|t| t.document_id),
            });
        }
        for (permit, job) in permits.zip(jobs) {
            self.queue.claim(&job.document_ids);
            permit.send(job);
        }
        self.queue.report_depth();
        // Remote workers are told now; a node that is not a replica of a shard keeps no copy
        // of its raw bytes once the replicas hold them.
        let mut remote: BTreeMap<(u64, u32), Vec<String>> = BTreeMap::new();
        for (worker, shard, id) in assignments {
            let placed_here = kb.replicas(shard).iter().any(|r| r.node == local);
            if !kb.placement.is_empty() && !placed_here {
                let _ = self.context.raw.remove(&id);
            }
            if worker != local {
                remote.entry((worker, shard)).or_default().push(id);
            }
        }
        handoff::notify_workers(&self.context, &kb.id, remote);
        Ok(added)
    }

    pub fn get_document(&self, scope: &Scope, kb: &str, document: &str) -> Result<DocumentRecord> {
        let kb = self.find_kb(scope, kb, Need::Read)?;
        self.store()
            .find_document(&kb.id, document)?
            .filter(|record| scope.may_read(record))
            .ok_or_else(|| SiftError::document_not_found(document))
    }

    /// A page of the documents of `kb` the scope may read, in id order, after the id `after`,
    /// only those in `status` when it is given. One request scans at most
    /// [`scan_budget`]`(limit)` records: a page may hold fewer than `limit` documents and still
    /// have a `next_after` (the last record scanned), so walking the pages sees every match.
    pub fn list_documents(
        &self,
        scope: &Scope,
        kb: &str,
        after: Option<&str>,
        limit: usize,
        status: Option<DocStatus>,
    ) -> Result<DocumentPage> {
        let kb = self.find_kb(scope, kb, Need::Read)?;
        let limit = limit.clamp(1, 1000);
        let store = self.store();
        page_documents(
            |after, count| Ok(store.list_documents(&kb.id, after, count)?),
            after,
            limit,
            scan_budget(limit),
            |document| scope.may_read(document) && status.is_none_or(|s| document.status == s),
        )
    }

    /// Deletes a document: a tombstone in metadata first (from then on no search returns it),
    /// then the shard delete, then the raw bytes.
    pub async fn delete_document(&self, scope: &Scope, kb: &str, document: &str) -> Result<()> {
        let kb = self.find_kb(scope, kb, Need::Write)?;
        let record = self
            .store()
            .find_document(&kb.id, document)?
            .filter(|record| scope.may_read(record))
            .ok_or_else(|| SiftError::document_not_found(document))?;
        self.context
            .meta
            .propose(MetaOp::DeleteDocument {
                kb_id: kb.id.clone(),
                document_id: record.id.clone(),
                at_ms: now_ms(),
            })
            .await?;
        self.context
            .access
            .delete(&kb, record.shard, &record.id)
            .await;
        let _ = self.context.raw.remove(&record.id);
        Ok(())
    }

    /// The chunks of a document, in order (from an active replica of its shard).
    pub async fn document_chunks(
        &self,
        scope: &Scope,
        kb: &str,
        document: &str,
    ) -> Result<Vec<ChunkView>> {
        let kb = self.find_kb_for_data(scope, kb, Need::Read).await?;
        let record = self
            .store()
            .find_document(&kb.id, document)?
            .filter(|record| scope.may_read(record))
            .ok_or_else(|| SiftError::document_not_found(document))?;
        match self
            .context
            .access
            .chunks(&kb, record.shard, &record.id)
            .await
        {
            Ok(Some(chunks)) => Ok(chunks),
            Ok(None) => Err(SiftError::Storage(sift_storage::StorageError::NotFound(
                format!("document {}", record.id),
            ))),
            Err(reason) => Err(SiftError::ShardUnavailable {
                kb_id: record.kb_id.clone(),
                shard: record.shard,
                reason: reason.to_string(),
            }),
        }
    }
}

/// The `unsupported_type` refusal of an upload whose name and media type name no format we
/// parse: an old binary Word or PowerPoint file is named as such, anything else gets the list
/// of supported extensions.
fn unsupported_upload(upload: &Upload) -> SiftError {
    use crate::ingest::office::{legacy_office_format, legacy_office_message, legacy_save_as};
    use crate::ingest::parse::{ParseError, SUPPORTED_EXTENSIONS};
    let legacy = legacy_office_format(&upload.file_name).or_else(|| {
        match upload.media_type.as_deref().map(|media| {
            media
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        }) {
            Some(media) if media == "application/msword" => Some("a Word 97-2003 document (.doc)"),
            Some(media) if media == "application/vnd.ms-powerpoint" => {
                Some("a PowerPoint 97-2003 presentation (.ppt)")
            }
            _ => None,
        }
    });
    let message = match legacy {
        Some(name) => format!(
            "{:?}: {}",
            upload.file_name,
            legacy_office_message(name, legacy_save_as(name))
        ),
        None => format!(
            "{:?}: supported types are {}",
            upload.file_name,
            SUPPORTED_EXTENSIONS
                .iter()
                .map(|extension| format!(".{extension}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    SiftError::Parse(ParseError::UnsupportedType(message))
}

/// What places a document on a shard: its external id when it has one (so the same corpus
/// loaded twice, or on two clusters, shards alike and ranks alike: BM25 statistics are per
/// shard), else its id.
fn routing_key<'a>(external_id: Option<&'a str>, id: &'a str) -> &'a str {
    external_id.unwrap_or(id)
}

fn validate_external_id(external_id: Option<&str>) -> Result<()> {
    match external_id {
        // A `/` is allowed (a URL is the default external id of a fetched page): in a route's
        // `{doc}` it is sent as `%2F`.
        Some(id) if id.is_empty() || id.len() > 512 || id.chars().any(char::is_control) => {
            Err(SiftError::invalid(
                "invalid_external_id",
                "external_id must be 1 to 512 bytes with no control characters",
            ))
        }
        _ => Ok(()),
    }
}

/// JSON metadata values become strings (scalars only) so filters are plain equality.
/// Records `groups` (checked) as the document's access groups in its metadata.
fn set_access(metadata: &mut Metadata, groups: &[String]) {
    if !groups.is_empty() {
        metadata.insert(ACCESS_GROUPS_KEY.to_string(), groups.join(","));
    }
}

/// The content hash of an upload readable by `groups`: the same bytes for other readers are
/// another document, not a duplicate of one the uploader may not see.
fn access_hash(bytes_hash: &str, groups: &[String]) -> String {
    if groups.is_empty() {
        return bytes_hash.to_string();
    }
    let mut hasher = Sha256::new();
    hasher.update(bytes_hash.as_bytes());
    hasher.update([0]);
    hasher.update(groups.join(",").as_bytes());
    hex::encode(hasher.finalize())
}

pub fn metadata_from_json(map: serde_json::Map<String, serde_json::Value>) -> Result<Metadata> {
    let mut metadata = Metadata::new();
    for (key, value) in map {
        let value = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(SiftError::invalid(
                    "invalid_metadata",
                    format!("metadata value of {key:?} must be a string, number or boolean"),
                ));
            }
        };
        if key.is_empty() || key.contains('=') || key.starts_with("sift.") {
            return Err(SiftError::invalid(
                "invalid_metadata",
                "metadata keys must be non-empty, without '=', and not start with \"sift.\" (reserved)",
            ));
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// One page of a KB's documents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DocumentPage {
    pub documents: Vec<DocumentRecord>,
    /// The `after` of the next page: the last record this one scanned; `None` once the KB's
    /// records are all scanned.
    pub next_after: Option<String>,
}

/// How many records one page request reads at most: ten pages' worth, at least 1,000 and at
/// most 10,000, so a filter that matches little costs a bounded amount of work per request.
pub fn scan_budget(limit: usize) -> usize {
    limit.saturating_mul(10).clamp(1_000, 10_000)
}

/// Reads pages of records from `fetch(after, count)` (id order, after `after`) until `limit`
/// of them are kept, the records run out, or `budget` records were scanned. `next_after` is
/// the last record consumed: the last kept one when the page filled, else the last scanned.
fn page_documents(
    mut fetch: impl FnMut(Option<&str>, usize) -> Result<Vec<DocumentRecord>>,
    after: Option<&str>,
    limit: usize,
    budget: usize,
    keep: impl Fn(&DocumentRecord) -> bool,
) -> Result<DocumentPage> {
    let limit = limit.max(1);
    let budget = budget.max(1);
    let mut documents = Vec::new();
    let mut after = after.map(String::from);
    let mut scanned = 0usize;
    loop {
        let count = limit.min(budget - scanned);
        let page = fetch(after.as_deref(), count)?;
        let exhausted = page.len() < count;
        scanned += page.len();
        for record in page {
            after = Some(record.id.clone());
            if keep(&record) {
                documents.push(record);
                if documents.len() == limit {
                    return Ok(DocumentPage {
                        documents,
                        next_after: after,
                    });
                }
            }
        }
        if exhausted {
            return Ok(DocumentPage {
                documents,
                next_after: None,
            });
        }
        if scanned >= budget {
            return Ok(DocumentPage {
                documents,
                next_after: after,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: usize, status: DocStatus, groups: &str) -> DocumentRecord {
        let mut metadata = Metadata::new();
        if !groups.is_empty() {
            metadata.insert(ACCESS_GROUPS_KEY.into(), groups.into());
        }
        DocumentRecord {
            id: format!("doc-{id:05}"),
            kb_id: "kb".into(),
            external_id: None,
            title: String::new(),
            source: DocSource::Text {
                format: "text".into(),
            },
            content_hash: String::new(),
            size_bytes: 1,
            shard: 0,
            status,
            error: None,
            chunk_count: 0,
            metadata,
            created_at_ms: 0,
            updated_at_ms: 0,
            pages_needing_ocr: 0,
        }
    }

    /// 300 records: every seventh failed, every fifth readable only by `hr`.
    fn store() -> Vec<DocumentRecord> {
        (0..300)
            .map(|i| {
                let status = if i % 7 == 3 {
                    DocStatus::Failed
                } else {
                    DocStatus::Ready
                };
                record(i, status, if i % 5 == 0 { "hr" } else { "" })
            })
            .collect()
    }

    /// Walks every page as a client does, counting the store reads.
    fn walk(
        records: &[DocumentRecord],
        limit: usize,
        budget: usize,
        keep: impl Fn(&DocumentRecord) -> bool,
    ) -> (Vec<String>, Vec<DocumentPage>) {
        let mut pages = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let read = reader(records);
            let fetch = |after: Option<&str>, count: usize| {
                assert!((1..=limit).contains(&count), "a store read of {count}");
                read(after, count)
            };
            let page = page_documents(fetch, after.as_deref(), limit, budget, &keep).unwrap();
            assert!(page.documents.len() <= limit);
            if let (Some(before), Some(next)) = (&after, &page.next_after) {
                assert!(next > before, "next_after advances");
            }
            after = page.next_after.clone();
            pages.push(page);
            if after.is_none() {
                break;
            }
            assert!(pages.len() < 1000, "the walk ends");
        }
        let ids = pages
            .iter()
            .flat_map(|p| p.documents.iter().map(|d| d.id.clone()))
            .collect();
        (ids, pages)
    }

    /// The store's `list_documents` over `records` (in id order): `count` after `after`.
    fn reader(
        records: &[DocumentRecord],
    ) -> impl Fn(Option<&str>, usize) -> Result<Vec<DocumentRecord>> + '_ {
        move |after, count| {
            Ok(records
                .iter()
                .filter(|r| after.is_none_or(|after| r.id.as_str() > after))
                .take(count)
                .cloned()
                .collect())
        }
    }

    fn expected(records: &[DocumentRecord], keep: impl Fn(&DocumentRecord) -> bool) -> Vec<String> {
        records
            .iter()
            .filter(|r| keep(r))
            .map(|r| r.id.clone())
            .collect()
    }

    #[test]
    fn walking_the_pages_with_a_status_and_a_scope_filter_returns_exactly_the_matches() {
        let records = store();
        let not_hr = |r: &DocumentRecord| {
            sift_storage::chunk::may_read(&r.metadata, Some(&["sales".to_string()]))
        };
        let failed = |r: &DocumentRecord| r.status == DocStatus::Failed;
        let failed_not_hr = |r: &DocumentRecord| failed(r) && not_hr(r);
        for limit in [1, 2, 3, 7, 10, 100, 1000] {
            for budget in [1, 5, 13, 50, 10_000] {
                let (ids, _) = walk(&records, limit, budget, failed_not_hr);
                assert_eq!(ids, expected(&records, failed_not_hr), "{limit} {budget}");
                let (ids, _) = walk(&records, limit, budget, |_| true);
                assert_eq!(ids, expected(&records, |_| true), "{limit} {budget}");
            }
        }
    }

    #[test]
    fn a_page_stops_at_the_scan_budget_and_continues_after_the_last_record_scanned() {
        let records = store();
        let failed = |r: &DocumentRecord| r.status == DocStatus::Failed;
        let fetch = reader(&records);
        // 20 records scanned: 3, 10 and 17 failed; the page is short but not the last.
        let page = page_documents(&fetch, None, 10, 20, failed).unwrap();
        let ids: Vec<&str> = page.documents.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["doc-00003", "doc-00010", "doc-00017"]);
        assert_eq!(page.next_after.as_deref(), Some("doc-00019"));
        // A full page continues after its last document, not after what was read past it.
        let page = page_documents(&fetch, None, 2, 1000, failed).unwrap();
        assert_eq!(page.next_after.as_deref(), Some("doc-00010"));
        // Nothing matches: empty pages that still advance, then the end.
        let (ids, pages) = walk(&records, 10, 100, |_| false);
        assert!(ids.is_empty());
        assert_eq!(pages.len(), 4, "300 records, 100 a request, then the end");
        assert!(pages[..3].iter().all(|p| p.next_after.is_some()));
        // A page that ends short of `limit` with the records is the last.
        let (_, pages) = walk(&records, 120, 10_000, |_| true);
        assert_eq!(pages.len(), 3);
        assert_eq!(pages[2].documents.len(), 60);
    }

    #[test]
    fn the_scan_budget_is_ten_pages_within_bounds() {
        assert_eq!(scan_budget(1), 1_000);
        assert_eq!(scan_budget(100), 1_000);
        assert_eq!(scan_budget(500), 5_000);
        assert_eq!(scan_budget(1000), 10_000);
    }
}
