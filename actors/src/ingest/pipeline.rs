//! One ingestion job: parse -> chunk -> embed -> write to the shard replicas -> ready.
//!
//! Every stage change is one metadata op for the whole job (not per document), so a bulk
//! request of thousands of documents costs a handful of metadata writes. A document that fails
//! a stage is marked failed with the reason and the rest of the job goes on.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use sift_storage::chunk::{
    ChunkRecord, DocumentCommit, DocumentEntry, DocumentSlice, DocumentWrite, PageRange,
    ParentRecord, ShardWrite,
};
use sift_storage::meta::{
    DocSource, DocStatus, DocumentRecord, KbRecord, MetaOp, MetaOutcome, StatusUpdate,
};
use tracing::{info, instrument, warn};

use sift_models::ocr::{OcrEngine, OcrError};

use super::chunk::{
    Chunked, ChunkerConfig, chunk_document, chunk_markdown_pages, chunk_pages, chunk_run,
};
use super::handoff::{self, Fetched};
use super::image::{ImageLimits, check_image};
use super::office::{RecordRun, stream_records, streams_records};
use super::parse::{
    Page, ParseError, ParseOptions, ParsedDocument, ScannedPage, SourceFormat, parse_document,
};
use super::pdf::{PageReport, Scanned};
use super::queue::IngestJob;
use crate::context::{NodeContext, NodeOptions};
use crate::error::{Result, SiftError};
use crate::events::{DocumentEvent, PageProgress};
use crate::meta::MetaHandle;
use crate::shards::ShardError;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The code a document's failure reason starts with when processing it was interrupted
/// [`NodeOptions::ingest_max_attempts`](crate::NodeOptions) times: it is not processed again.
pub const CRASHED_PROCESSING: &str = "crashed_processing";

/// Fault injection (`debug_faults` only): a document whose raw bytes contain this aborts the
/// process while it is parsed, like a parser bug would. Tests use it to check that a poison
/// document cannot crash-loop a node.
pub const DEBUG_ABORT_MARKER: &str = "SIFT-DEBUG-FAULT:abort-while-parsing";

/// A document moving through the stages.
struct Work {
    record: DocumentRecord,
    /// Earlier starts of processing that never finished (see [`PendingWork::attempts`]).
    ///
    /// [`PendingWork::attempts`]: sift_storage::meta::PendingWork
    attempts: u32,
    parsed: Option<ParsedDocument>,
    write: Option<DocumentWrite>,
    /// The title put before each chunk's text when it is embedded (a document's own title,
    /// or a text document's given one).
    embed_title: Option<String>,
    /// The chunks of a document written in slices (its `write` gives them up as it goes).
    sliced_chunks: Option<u32>,
    failure: Option<String>,
    /// A transient error (a shard unreachable, no quorum) stopped this document: it stays
    /// pending and is tried again.
    deferred: bool,
    /// Where the parse saved its scanned pages' images for OCR (removed once read).
    ocr_folder: Option<PathBuf>,
    /// Scanned pages left without text (no OCR engine, or one that could not read them).
    pages_needing_ocr: u32,
}

impl Work {
    /// An OCR engine away (after its retries): the document stays pending and is tried
    /// again, its parse dropped.
    fn defer_for_ocr(&mut self, deferred: &mut Deferred, error: &dyn std::fmt::Display) {
        warn!(document_id = %self.record.id, %error, "OCR unavailable for now");
        self.deferred = true;
        self.parsed = None;
        deferred.add(self.record.id.clone(), &error.to_string());
    }

    /// The chunks it has (or had, when written in slices).
    fn chunk_count(&self) -> Option<u32> {
        self.sliced_chunks
            .or_else(|| Some(self.write.as_ref()?.chunks.len() as u32))
    }

    fn fail(&mut self, reason: impl Into<String>) {
        if self.failure.is_none() {
            self.failure = Some(reason.into());
        }
    }
}

/// The source format of a registered document: an upload's as recorded when it was checked
/// (a PDF named by its media type has no `.pdf` to go by), else by its file name.
pub fn source_format(record: &DocumentRecord) -> Option<SourceFormat> {
    match &record.source {
        DocSource::Upload { file_name, format } => {
            SourceFormat::from_name(format).or_else(|| SourceFormat::from_file_name(file_name))
        }
        DocSource::Text { format } => match format.as_str() {
            "markdown" | "md" => Some(SourceFormat::Markdown),
            "html" => Some(SourceFormat::Html),
            _ => Some(SourceFormat::Text),
        },
    }
}

pub fn parse_options(kb: &KbRecord, options: &NodeOptions) -> ParseOptions {
    ParseOptions {
        json_text_field: kb.settings.json_text_field.clone(),
        json_title_field: kb.settings.json_title_field.clone(),
        pdf: options.pdf_limits.clone(),
        office: options.office_limits.clone(),
        ..ParseOptions::default()
    }
}

pub fn chunker_config(kb: &KbRecord) -> ChunkerConfig {
    let chunk_tokens = kb.settings.chunk_tokens as usize;
    ChunkerConfig {
        chunk_tokens,
        overlap_tokens: kb.settings.chunk_overlap_tokens as usize,
        parent_tokens: kb.settings.parent_tokens as usize,
        min_tail_tokens: (chunk_tokens / 4).max(1),
    }
}

/// Documents of a job that a transient error (no Raft leader, a ReadIndex timeout, a shard or
/// the embedding service unreachable) stopped: they stay pending, to be tried again.
#[derive(Debug, Default)]
pub struct Deferred {
    pub document_ids: Vec<String>,
    /// The last transient error met.
    pub reason: String,
}

impl Deferred {
    fn add(&mut self, document_id: String, reason: &str) {
        self.document_ids.push(document_id);
        self.reason = reason.to_string();
    }
}

/// Runs one job to the end: every document ends ready or failed (or deleted), except those
/// a transient error stopped, which are returned pending (see [`Deferred`]).
#[instrument(skip_all, fields(kb_id = %job.kb_id, documents = job.document_ids.len()))]
pub async fn process(context: &Arc<NodeContext>, job: IngestJob) -> Deferred {
    let started = Instant::now();
    let deferred = match run(context, &job).await {
        Ok(deferred) => deferred,
        // The cluster or a service is away for a moment: an acknowledged document is not
        // failed for that (the chaos soak's "failed" documents came from here).
        Err(error) if error.is_transient() => {
            warn!(%error, "ingestion job stopped by a transient error; its documents stay pending");
            // Best effort (the metadata may be what is away): an attempt that ended this way
            // is not counted as a crash.
            let updates = job
                .document_ids
                .iter()
                .map(|id| requeued(id.clone()))
                .collect();
            let _ = context
                .meta
                .propose(MetaOp::SetDocumentStatus {
                    kb_id: job.kb_id.clone(),
                    updates,
                    at_ms: now_ms(),
                })
                .await;
            Deferred {
                document_ids: job.document_ids.clone(),
                reason: error.to_string(),
            }
        }
        Err(error) => {
            warn!(%error, "ingestion job failed");
            fail_unfinished(context, &job, &error.to_string()).await;
            Deferred::default()
        }
    };
    metrics::histogram!("sift_ingest_job_seconds").record(started.elapsed().as_secs_f64());
    metrics::counter!("sift_ingest_deferred_total").increment(deferred.document_ids.len() as u64);
    deferred
}

async fn run(context: &Arc<NodeContext>, job: &IngestJob) -> Result<Deferred> {
    // Cluster mode: this node's metadata may lag (it just restarted): catch up first, so
    // that finished or reassigned documents are not processed again.
    context.meta.linearizable_barrier().await?;
    let store = context.meta.store().clone();
    let local = context.access.local_id();
    let Some(kb) = store.get_kb(&job.kb_id)? else {
        return Ok(Deferred::default()); // the KB was deleted meanwhile
    };
    let mut works: Vec<Work> = Vec::new();
    for id in &job.document_ids {
        let Some(pending) = store
            .pending_work(&kb.id, id)?
            .filter(|work| work.worker == local || work.worker == 0)
        else {
            continue;
        };
        if let Some(record) = store.get_document(&kb.id, id)?
            && !record.status.is_terminal()
        {
            works.push(Work {
                record,
                attempts: pending.attempts,
                parsed: None,
                write: None,
                embed_title: None,
                sliced_chunks: None,
                failure: None,
                deferred: false,
                ocr_folder: None,
                pages_needing_ocr: 0,
            });
        }
    }
    if works.is_empty() {
        return Ok(Deferred::default());
    }

    // Documents whose processing was interrupted too often (the process died while working
    // on them, every time) are failed rather than tried again: one of them may be what kills
    // the process, and a node that crashes on every restart serves nothing.
    // A retry after a transient error may find the attempt marks of its earlier runs still
    // there (taking them back needs the metadata that was away): those were no crashes.
    let limit = context.options.ingest_max_attempts;
    let (given_up, works): (Vec<Work>, Vec<Work>) = works
        .into_iter()
        .partition(|work| work.attempts >= limit.saturating_add(job.retries));
    if !given_up.is_empty() {
        let ids: Vec<String> = given_up.iter().map(|work| work.record.id.clone()).collect();
        warn!(documents = ?ids, attempts = limit, "documents interrupted too often; failing them");
        let reason = format!(
            "{CRASHED_PROCESSING}: processing this document was interrupted {limit} times (the \
             node stopped or crashed while working on it); it is not tried again"
        );
        fail_unfinished_documents(context, &kb.id, &ids, &reason).await;
        // A document written in slices may have left some on its replicas.
        for work in &given_up {
            context
                .access
                .delete(&kb, work.record.shard, &work.record.id)
                .await;
        }
    }

    // A document whose earlier attempt was interrupted goes alone, so that if it is what
    // crashed the node it cannot take the rest of its job down with it again.
    let (retried, fresh): (Vec<Work>, Vec<Work>) =
        works.into_iter().partition(|work| work.attempts > 0);
    let mut deferred = Deferred::default();
    for work in retried {
        run_works(context, &kb, vec![work], &mut deferred).await?;
    }
    run_works(context, &kb, fresh, &mut deferred).await?;
    Ok(deferred)
}

/// Runs `works` (documents of `kb`) through the stages together; those a transient error
/// stops go to `deferred`.
async fn run_works(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: Vec<Work>,
    deferred: &mut Deferred,
) -> Result<()> {
    if works.is_empty() {
        return Ok(());
    }

    // A worker that was handed the document may not hold its raw bytes yet.
    let mut kept = Vec::with_capacity(works.len());
    for mut work in works {
        if !context.raw.has(&work.record) {
            match handoff::fetch_raw(context, kb, &work.record).await {
                Fetched::Stored => {}
                Fetched::Lost => work.fail("the raw bytes of the document are on no node"),
                Fetched::Unreachable(reason) => {
                    warn!(document_id = %work.record.id, %reason, "raw bytes not reachable yet");
                    deferred.add(work.record.id, &reason);
                    continue;
                }
            }
        }
        kept.push(work);
    }
    // A large spreadsheet or CSV file is read, chunked, embedded and written a run of rows
    // at a time, alone, after the others.
    let stream_bytes = context.options.ingest_stream_bytes;
    let (streamed, works): (Vec<Work>, Vec<Work>) = kept.into_iter().partition(|work| {
        work.failure.is_none()
            && work.record.size_bytes >= stream_bytes
            && source_format(&work.record).is_some_and(streams_records)
    });
    parse_and_write(context, kb, works, deferred).await?;
    for work in streamed {
        let Some(mut work) = set_stage(context, kb, vec![work], DocStatus::Parsing)
            .await?
            .pop()
        else {
            continue; // deleted meanwhile
        };
        work.write = Some(DocumentWrite {
            entry: DocumentEntry {
                document_id: work.record.id.clone(),
                external_id: work.record.external_id.clone(),
                title: work.record.title.clone(),
                metadata: work.record.metadata.clone(),
            },
            parents: Vec::new(),
            chunks: Vec::new(),
        });
        let slices = stream_slices(context, kb, &work);
        write_in_slices(context, kb, work, slices, deferred).await?;
    }
    Ok(())
}

/// Parses and chunks `works` whole, then embeds and writes them (a document of many chunks
/// alone, in slices).
async fn parse_and_write(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: Vec<Work>,
    deferred: &mut Deferred,
) -> Result<()> {
    if works.is_empty() {
        return Ok(());
    }

    // Parse and chunk (CPU work, off the async runtime).
    let mut works = set_stage(context, kb, works, DocStatus::Parsing).await?;
    let stage = Instant::now();
    recognize_images(context, kb, &mut works, deferred).await;
    let raw = context.raw.clone();
    let options = parse_options(kb, &context.options);
    // With an OCR engine for the KB, a PDF's scanned pages are saved as images for it.
    let ocr_scratch = context
        .options
        .ocr
        .engine_for(&kb.settings.ocr)
        .is_ok()
        .then(|| context.scratch.clone());
    let debug_faults = context.options.debug_faults;
    let meta = context.meta.clone();
    works = blocking(move || {
        for work in &mut works {
            if work.parsed.is_some() || work.failure.is_some() || work.deferred {
                continue; // an image, recognised or not
            }
            let parsed = raw.load(&work.record).and_then(|bytes| {
                let format = source_format(&work.record).ok_or_else(|| {
                    SiftError::invalid("unsupported_type", "unknown source format")
                })?;
                if debug_faults && contains(&bytes, DEBUG_ABORT_MARKER.as_bytes()) {
                    tracing::error!(document_id = %work.record.id, "debug fault: aborting");
                    std::process::abort();
                }
                let mut options = options.clone();
                if format == SourceFormat::Pdf
                    && let Some(scratch) = &ocr_scratch
                {
                    let folder = scratch.join(format!("ocr-{}", work.record.id));
                    std::fs::create_dir_all(&folder).map_err(|e| SiftError::Storage(e.into()))?;
                    options.pdf.scanned = Scanned::SaveImages(folder.clone());
                    work.ocr_folder = Some(folder);
                }
                if format == SourceFormat::Pdf {
                    options.pdf.report = parse_pages_report(&meta, &work.record);
                }
                Ok(unpanicked("parsing", || {
                    parse_document(&bytes, format, &options)
                })??)
            });
            match parsed {
                Ok(parsed) => work.parsed = Some(parsed),
                // "encrypted_pdf: the PDF is encrypted ...": the reason starts with its code.
                Err(error @ SiftError::Parse(_)) => work.fail(format!("{}: {error}", error.code())),
                Err(error) => work.fail(error.to_string()),
            }
        }
        works
    })
    .await?;
    recognize_scanned_pages(context, kb, &mut works, deferred).await;
    recognize_pictures(context, kb, &mut works, deferred).await;
    record_stage("parse", stage);

    let mut works = set_stage(context, kb, works, DocStatus::Chunking).await?;
    let stage = Instant::now();
    let config = chunker_config(kb);
    works = blocking(move || {
        for work in &mut works {
            let Some(parsed) = work.parsed.take() else {
                continue;
            };
            let chunked = match unpanicked("chunking", || {
                if parsed.pages.is_empty() {
                    chunk_document(&parsed.text, parsed.markdown, &config)
                } else if parsed.markdown {
                    chunk_markdown_pages(&parsed.text, &parsed.pages, &config)
                } else {
                    chunk_pages(&parsed.text, &parsed.pages, &config)
                }
            }) {
                Ok(chunked) => chunked,
                Err(error) => {
                    work.fail(error.to_string());
                    continue;
                }
            };
            if chunked.children.is_empty() {
                work.fail("the document has no text to index");
                continue;
            }
            let explicit_title = parsed.title.clone().or_else(|| match work.record.source {
                DocSource::Text { .. } if !work.record.title.is_empty() => {
                    Some(work.record.title.clone())
                }
                _ => None,
            });
            work.embed_title = explicit_title.clone();
            let title = explicit_title.unwrap_or_else(|| work.record.title.clone());
            work.write = Some(DocumentWrite {
                entry: DocumentEntry {
                    document_id: work.record.id.clone(),
                    external_id: work.record.external_id.clone(),
                    title,
                    metadata: work.record.metadata.clone(),
                },
                parents: chunked
                    .parents
                    .into_iter()
                    .map(|parent| ParentRecord {
                        position: parent.position,
                        text: parent.text,
                        span: parent.span,
                        pages: parent.pages.map(PageRange::new),
                    })
                    .collect(),
                chunks: chunked
                    .children
                    .into_iter()
                    .map(|child| ChunkRecord {
                        position: child.position,
                        parent_position: child.parent_position,
                        text: child.text,
                        heading_path: child.heading_path,
                        span: child.span,
                        vector: Vec::new(),
                        pages: child.pages.map(PageRange::new),
                    })
                    .collect(),
            });
        }
        works
    })
    .await?;
    record_stage("chunk", stage);

    // A document of many chunks goes on alone, in slices; the others together.
    let slice_chunks = context.options.ingest_slice_chunks;
    let (large, works): (Vec<Work>, Vec<Work>) = works.into_iter().partition(|work| {
        work.failure.is_none()
            && work
                .write
                .as_ref()
                .is_some_and(|write| is_large(write, slice_chunks))
    });
    embed_and_write(context, kb, works, deferred).await?;
    for mut work in large {
        let slices = match work.write.as_mut() {
            Some(write) => Slices::Chunked {
                total: write.chunks.len() as u32,
                chunks: VecDeque::from(std::mem::take(&mut write.chunks)),
                parents: VecDeque::from(std::mem::take(&mut write.parents)),
            },
            None => continue,
        };
        write_in_slices(context, kb, work, slices, deferred).await?;
    }
    Ok(())
}

/// Embeds every chunk of `works` in one call (the embedder batches) and writes each shard's
/// documents to its replicas, all shards in parallel; then their final statuses.
async fn embed_and_write(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: Vec<Work>,
    deferred: &mut Deferred,
) -> Result<()> {
    if works.is_empty() {
        return Ok(());
    }
    let mut works = set_stage(context, kb, works, DocStatus::Embedding).await?;
    let stage = Instant::now();
    let embedder = kb_embedder(context, kb)?;
    let texts: Vec<String> = works
        .iter()
        .filter(|work| work.failure.is_none())
        .filter_map(|work| Some((work.embed_title.as_deref(), &work.write.as_ref()?.chunks)))
        .flat_map(|(title, chunks)| chunks.iter().map(move |chunk| embed_text(title, chunk)))
        .collect();
    let text_count = texts.len();
    let mut vectors = context.embed_cached(&embedder, texts).await?.into_iter();
    for work in works.iter_mut().filter(|work| work.failure.is_none()) {
        if let Some(write) = &mut work.write {
            for chunk in &mut write.chunks {
                chunk.vector = vectors.next().unwrap_or_default();
            }
        }
    }
    record_stage("embed", stage);
    metrics::counter!("sift_ingest_chunks_embedded_total").increment(text_count as u64);

    // Write each shard's documents to its replica, all shards in parallel.
    let works = set_stage(context, kb, works, DocStatus::Indexing).await?;
    let stage = Instant::now();
    let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (position, work) in works.iter().enumerate() {
        if work.failure.is_none() && work.write.is_some() {
            by_shard
                .entry(work.record.shard)
                .or_default()
                .push(position);
        }
    }
    let mut works = works;
    let writes = by_shard.into_iter().map(|(shard, positions)| {
        let documents: Vec<DocumentWrite> = positions
            .iter()
            .filter_map(|&p| works[p].write.clone())
            .collect();
        async move { (positions, context.access.write(kb, shard, documents).await) }
    });
    for (positions, outcome) in join_all(writes).await {
        if let Err(error) = outcome {
            let transient = error.is_transient();
            let reason = error.to_string();
            for position in positions {
                if transient {
                    works[position].deferred = true;
                    deferred.add(works[position].record.id.clone(), &reason);
                } else {
                    works[position].fail(reason.clone());
                }
            }
        }
    }
    record_stage("index", stage);

    finish(context, kb, works).await
}

/// Records the final statuses of `works`; documents deleted meanwhile are removed from their
/// shard again.
async fn finish(context: &Arc<NodeContext>, kb: &KbRecord, works: Vec<Work>) -> Result<()> {
    let store = context.meta.store().clone();
    let updates: Vec<StatusUpdate> = works
        .iter()
        .map(|work| match &work.failure {
            _ if work.deferred => requeued(work.record.id.clone()),
            Some(reason) => StatusUpdate {
                document_id: work.record.id.clone(),
                status: DocStatus::Failed,
                error: Some(reason.clone()),
                chunk_count: Some(0),
                pages_needing_ocr: Some(work.pages_needing_ocr),
            },
            None => StatusUpdate {
                document_id: work.record.id.clone(),
                status: DocStatus::Ready,
                error: None,
                chunk_count: work.chunk_count(),
                pages_needing_ocr: Some(work.pages_needing_ocr),
            },
        })
        .collect();
    let outcome = context
        .meta
        .propose(MetaOp::SetDocumentStatus {
            kb_id: kb.id.clone(),
            updates,
            at_ms: now_ms(),
        })
        .await?;
    let live: std::collections::HashSet<String> = match outcome {
        MetaOutcome::Statuses(records) => records.into_iter().map(|r| r.id).collect(),
        _ => Default::default(),
    };
    let mut ready = 0u64;
    let mut failed = 0u64;
    for work in works.iter().filter(|work| !work.deferred) {
        if !live.contains(&work.record.id) {
            // Deleted meanwhile (not finished by another worker): remove what was written.
            let deleted = store.get_document(&kb.id, &work.record.id)?.is_none();
            if deleted && work.write.is_some() {
                context
                    .access
                    .delete(kb, work.record.shard, &work.record.id)
                    .await;
            }
            continue;
        }
        if work.failure.is_some() {
            failed += 1;
        } else {
            ready += 1;
        }
    }
    metrics::counter!("sift_ingest_documents_total", "status" => "ready").increment(ready);
    metrics::counter!("sift_ingest_documents_total", "status" => "failed").increment(failed);
    metrics::counter!("sift_ingest_chunks_total").increment(
        works
            .iter()
            .filter(|w| w.failure.is_none() && !w.deferred)
            .filter_map(Work::chunk_count)
            .map(u64::from)
            .sum(),
    );
    info!(ready, failed, "ingestion job done");
    Ok(())
}

/// Embeds and writes one document of many chunks in slices of `ingest_slice_chunks`: each
/// slice's texts are embedded and its chunks and parents written to the shard's replicas
/// (durable there, not searchable), then a commit makes the whole document live on each
/// replica at once. The node holds one slice's vectors at a time and no shard write is
/// larger than a slice; a streamed document's text is not held whole either. A failure
/// removes the slices written; a transient one leaves them to the retry, which writes them
/// again.
async fn write_in_slices(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    work: Work,
    mut slices: Slices,
    deferred: &mut Deferred,
) -> Result<()> {
    let Some(mut work) = set_stage(context, kb, vec![work], DocStatus::Embedding)
        .await?
        .pop()
    else {
        return Ok(()); // deleted meanwhile
    };
    let entry = match &work.write {
        Some(write) => write.entry.clone(),
        None => return Ok(()),
    };
    let shard = work.record.shard;
    let stage = Instant::now();
    let mut chunk_count = 0u32;
    let mut parent_count = 0u32;
    let written = async {
        let embedder = kb_embedder(context, kb)?;
        let slice_chunks = context.options.ingest_slice_chunks;
        let mut event = DocumentEvent::from_record(&work.record);
        event.status = DocStatus::Embedding;
        event.progress = crate::events::progress(DocStatus::Embedding);
        while let Some(next) = slices.next(slice_chunks).await? {
            let (mut slice, slice_parents) = (next.chunks, next.parents);
            chunk_count += slice.len() as u32;
            parent_count += slice_parents.len() as u32;
            let texts = slice
                .iter()
                .map(|chunk| embed_text(work.embed_title.as_deref(), chunk))
                .collect();
            let vectors = context.embed_cached(&embedder, texts).await?;
            for (chunk, vector) in slice.iter_mut().zip(vectors) {
                chunk.vector = vector;
            }
            metrics::counter!("sift_ingest_chunks_embedded_total").increment(slice.len() as u64);
            let slice = DocumentSlice {
                document_id: entry.document_id.clone(),
                parents: slice_parents,
                chunks: slice,
            };
            context
                .access
                .apply(kb, shard, ShardWrite::Slice(slice))
                .await?;
            event.embedded_chunks = Some(PageProgress {
                done: chunk_count,
                total: next.total.max(chunk_count),
            });
            context.meta.send_progress(event.clone());
        }
        record_stage("embed", stage);
        if chunk_count == 0 {
            return Err(Stopped {
                transient: false,
                reason: "the document has no text to index".into(),
            });
        }
        Ok::<_, Stopped>(())
    }
    .await;
    work.sliced_chunks = Some(chunk_count);
    let committed = match written {
        Ok(()) => {
            let Some(committing) = set_stage(context, kb, vec![work], DocStatus::Indexing)
                .await?
                .pop()
            else {
                // Deleted meanwhile: its slices go with it.
                context.access.delete(kb, shard, &entry.document_id).await;
                return Ok(());
            };
            work = committing;
            let stage = Instant::now();
            let commit = DocumentCommit {
                entry: entry.clone(),
                chunk_count,
                parent_count,
            };
            let outcome = context
                .access
                .apply(kb, shard, ShardWrite::Commit(commit))
                .await
                .map_err(Stopped::from);
            record_stage("index", stage);
            outcome
        }
        Err(error) => Err(error),
    };
    if let Err(stopped) = committed {
        if stopped.transient {
            work.deferred = true;
            deferred.add(work.record.id.clone(), &stopped.reason);
        } else {
            warn!(document_id = %work.record.id, reason = %stopped.reason, "writing a document in slices failed");
            work.fail(stopped.reason);
            context.access.delete(kb, shard, &entry.document_id).await;
        }
    }
    finish(context, kb, vec![work]).await
}

/// Where a document written in slices takes its slices from.
enum Slices {
    /// A document chunked whole: its chunks and parents, given up a slice at a time.
    Chunked {
        chunks: VecDeque<ChunkRecord>,
        parents: VecDeque<ParentRecord>,
        total: u32,
    },
    /// A large spreadsheet or CSV file read a run of rows at a time on a blocking thread
    /// ([`stream_slices`]), which chunks each run and sends whole slices, one ahead.
    Streamed(tokio::sync::mpsc::Receiver<Result<NextSlice>>),
}

/// A slice's chunks and parents, and the document's chunks as far as they are known.
struct NextSlice {
    chunks: Vec<ChunkRecord>,
    parents: Vec<ParentRecord>,
    /// The document's chunk count: exact for a document chunked whole and for a streamed
    /// document's last slice, else estimated from the share of the file read.
    total: u32,
}

impl Slices {
    /// The next slice, or `None` once every chunk was given.
    async fn next(
        &mut self,
        slice_chunks: usize,
    ) -> std::result::Result<Option<NextSlice>, Stopped> {
        match self {
            Slices::Chunked {
                chunks,
                parents,
                total,
            } => {
                let (chunks, parents) = next_slice(chunks, parents, slice_chunks, SLICE_BYTES);
                Ok(
                    (!chunks.is_empty() || !parents.is_empty()).then_some(NextSlice {
                        chunks,
                        parents,
                        total: *total,
                    }),
                )
            }
            Slices::Streamed(receiver) => match receiver.recv().await {
                None => Ok(None),
                Some(Ok(slice)) => Ok(Some(slice)),
                // "invalid_document: unreadable CSV at row 9: ...": the reason starts with its
                // code, as for a document parsed whole.
                Some(Err(error @ SiftError::Parse(_))) => Err(Stopped {
                    transient: false,
                    reason: format!("{}: {error}", error.code()),
                }),
                Some(Err(error)) => Err(Stopped::from(error)),
            },
        }
    }
}

/// Bytes of Markdown a streamed spreadsheet hands to the chunker at a time.
pub const RUN_BYTES: usize = 256 * 1024;

/// Starts reading a large spreadsheet or CSV file (`work`'s) on a blocking thread: a run of
/// rows at a time is chunked, its chunks and parents numbered on from the runs before, and
/// sent on in slices as [`next_slice`] cuts them. The channel holds one slice: the reader
/// waits while the slice before is embedded and written, so the node holds the file, about
/// two slices and one run. A parse error (a bad row, a limit passed) ends the stream with it.
fn stream_slices(context: &Arc<NodeContext>, kb: &KbRecord, work: &Work) -> Slices {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    let raw = context.raw.clone();
    let record = work.record.clone();
    let config = chunker_config(kb);
    let limits = context.options.office_limits.clone();
    let slice_chunks = context.options.ingest_slice_chunks;
    tokio::task::spawn_blocking(move || {
        let outcome = unpanicked("reading the spreadsheet", || {
            let format = source_format(&record)
                .ok_or_else(|| SiftError::invalid("unsupported_type", "unknown source format"))?;
            let bytes = raw.load(&record)?;
            let mut slicer = Slicer::new(slice_chunks, &sender);
            stream_records(&bytes, format, &limits, RUN_BYTES, &mut |run| {
                slicer.add(run, &config)
            })?;
            slicer.finish();
            Ok::<_, SiftError>(())
        });
        if let Err(error) = outcome.and_then(|outcome| outcome) {
            // The receiver may be gone (the writer stopped first): nothing to tell then.
            let _ = sender.blocking_send(Err(error));
        }
    });
    Slices::Streamed(receiver)
}

/// Numbers the chunks of a streamed document's runs on and sends them in slices, one slice
/// held back so that the last can say it is the last.
struct Slicer<'a> {
    slice_chunks: usize,
    sender: &'a tokio::sync::mpsc::Sender<Result<NextSlice>>,
    chunks: VecDeque<ChunkRecord>,
    parents: VecDeque<ParentRecord>,
    /// The positions the next run's first chunk and parent take.
    next_chunk: u32,
    next_parent: u32,
    held: Option<NextSlice>,
    read: f64,
}

impl<'a> Slicer<'a> {
    fn new(slice_chunks: usize, sender: &'a tokio::sync::mpsc::Sender<Result<NextSlice>>) -> Self {
        Slicer {
            slice_chunks: slice_chunks.max(1),
            sender,
            chunks: VecDeque::new(),
            parents: VecDeque::new(),
            next_chunk: 0,
            next_parent: 0,
            held: None,
            read: 0.0,
        }
    }

    /// Chunks one run and sends the slices it completes. Fails once the writer is gone.
    fn add(
        &mut self,
        run: RecordRun<'_>,
        config: &ChunkerConfig,
    ) -> std::result::Result<(), ParseError> {
        let Chunked { parents, children } = chunk_run(run.text, run.heading_path, config);
        let shift = |span: (u32, u32)| {
            let start = u32::try_from(run.start_char).unwrap_or(u32::MAX);
            (span.0.saturating_add(start), span.1.saturating_add(start))
        };
        let (chunk_base, parent_base) = (self.next_chunk, self.next_parent);
        self.next_chunk += children.len() as u32;
        self.next_parent += parents.len() as u32;
        self.parents
            .extend(parents.into_iter().map(|parent| ParentRecord {
                position: parent_base + parent.position,
                text: parent.text,
                span: shift(parent.span),
                pages: None,
            }));
        self.chunks
            .extend(children.into_iter().map(|child| ChunkRecord {
                position: chunk_base + child.position,
                parent_position: parent_base + child.parent_position,
                text: child.text,
                heading_path: child.heading_path,
                span: shift(child.span),
                vector: Vec::new(),
                pages: None,
            }));
        self.read = run.read;
        while self.chunks.len() >= self.slice_chunks || self.text_bytes() >= SLICE_BYTES {
            let (chunks, parents) = next_slice(
                &mut self.chunks,
                &mut self.parents,
                self.slice_chunks,
                SLICE_BYTES,
            );
            if !self.send(chunks, parents) {
                return Err(ParseError::InvalidDocument("the writer stopped".into()));
            }
        }
        Ok(())
    }

    /// Sends what is left, the last slice marked as such.
    fn finish(mut self) {
        while !self.chunks.is_empty() || !self.parents.is_empty() {
            let (chunks, parents) = next_slice(
                &mut self.chunks,
                &mut self.parents,
                self.slice_chunks,
                SLICE_BYTES,
            );
            if !self.send(chunks, parents) {
                return;
            }
        }
        if let Some(mut last) = self.held.take() {
            last.total = self.next_chunk;
            let _ = self.sender.blocking_send(Ok(last));
        }
    }

    /// Sends the slice held back and holds this one; false once the writer is gone.
    fn send(&mut self, chunks: Vec<ChunkRecord>, parents: Vec<ParentRecord>) -> bool {
        let estimate = if self.read > 0.0 {
            (f64::from(self.next_chunk) / self.read).min(f64::from(u32::MAX)) as u32
        } else {
            self.next_chunk
        };
        let slice = NextSlice {
            chunks,
            parents,
            total: estimate.max(self.next_chunk),
        };
        match self.held.replace(slice) {
            Some(before) => self.sender.blocking_send(Ok(before)).is_ok(),
            None => true,
        }
    }

    fn text_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.text.len()).sum::<usize>()
            + self.parents.iter().map(|p| p.text.len()).sum::<usize>()
    }
}

/// Text a slice carries at most (its chunks' and parents' texts), whatever its chunk count: a
/// slice is one shard request, and a node takes requests of up to 80 MiB.
const SLICE_BYTES: usize = 16 * 1024 * 1024;

/// Whether a document is written in slices: more than `slice_chunks` chunks, or more text than
/// one slice carries.
fn is_large(write: &DocumentWrite, slice_chunks: usize) -> bool {
    let bytes: usize = write.chunks.iter().map(|c| c.text.len()).sum::<usize>()
        + write.parents.iter().map(|p| p.text.len()).sum::<usize>();
    write.chunks.len() > slice_chunks || bytes > SLICE_BYTES
}

/// The next slice of a document: its next chunks, at most `max_chunks` and, past the first,
/// no more than `max_bytes` of text with their parents; and the parents they name first
/// (those left after the last chunk go with the last slice). Empty when nothing is left.
fn next_slice(
    chunks: &mut VecDeque<ChunkRecord>,
    parents: &mut VecDeque<ParentRecord>,
    max_chunks: usize,
    max_bytes: usize,
) -> (Vec<ChunkRecord>, Vec<ParentRecord>) {
    let mut slice = Vec::new();
    let mut slice_parents = Vec::new();
    let mut bytes = 0usize;
    while slice.len() < max_chunks.max(1) {
        let Some(chunk) = chunks.front() else {
            break;
        };
        let named = parents
            .iter()
            .take_while(|parent| parent.position <= chunk.parent_position)
            .count();
        let size = chunk.text.len()
            + parents
                .iter()
                .take(named)
                .map(|parent| parent.text.len())
                .sum::<usize>();
        if !slice.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        slice_parents.extend(parents.drain(..named));
        slice.extend(chunks.pop_front());
    }
    if chunks.is_empty() {
        slice_parents.extend(parents.drain(..));
    }
    (slice, slice_parents)
}

/// Why writing a document in slices stopped, and whether a retry may do better.
struct Stopped {
    transient: bool,
    reason: String,
}

impl From<SiftError> for Stopped {
    fn from(error: SiftError) -> Self {
        Stopped {
            transient: error.is_transient(),
            reason: error.to_string(),
        }
    }
}

impl From<ShardError> for Stopped {
    fn from(error: ShardError) -> Self {
        Stopped {
            transient: error.is_transient(),
            reason: error.to_string(),
        }
    }
}

/// The KB's embedder, checked against the KB's dimension.
fn kb_embedder(context: &NodeContext, kb: &KbRecord) -> Result<sift_models::embedding::Embedder> {
    let embedder = context.embedders.get(&kb.settings.embedding_model)?;
    if embedder.dimension() != kb.settings.dimension as usize {
        return Err(SiftError::invalid(
            "dimension_mismatch",
            format!(
                "embedding model {} has dimension {}, the knowledge base expects {}",
                embedder.model_name(),
                embedder.dimension(),
                kb.settings.dimension
            ),
        ));
    }
    Ok(embedder)
}

/// What is embedded for a chunk: its text, after the document's title when it has one.
fn embed_text(title: Option<&str>, chunk: &ChunkRecord) -> String {
    match title {
        Some(title) => format!("{title}\n{}", chunk.text),
        None => chunk.text.clone(),
    }
}

/// Recognises the text of the image documents among `works` with the KB's OCR engine, all
/// at once (the engine bounds the images in flight on the node). An engine that is away
/// (after its retries) defers the document; any other failure fails it with its reason.
async fn recognize_images(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: &mut [Work],
    deferred: &mut Deferred,
) {
    let images: Vec<usize> = works
        .iter()
        .enumerate()
        .filter(|(_, work)| source_format(&work.record) == Some(SourceFormat::Image))
        .map(|(position, _)| position)
        .collect();
    if images.is_empty() {
        return;
    }
    let ocr = &context.options.ocr;
    let limits = ImageLimits::default();
    let recognized = join_all(images.iter().map(|&position| {
        let record_for_load = works[position].record.clone();
        let raw = context.raw.clone();
        let limits = limits.clone();
        async move {
            let engine = ocr.engine_for(&kb.settings.ocr)?;
            let (bytes, media_type) = blocking(move || -> Result<(Vec<u8>, &'static str)> {
                let bytes = raw.load(&record_for_load)?;
                let info = check_image(&bytes, &limits)?;
                Ok((bytes, info.media_type))
            })
            .await??;
            let text = ocr
                .recognize(engine, &bytes, media_type, &kb.settings.language)
                .await?;
            let markdown = engine == OcrEngine::Vision;
            Ok::<_, SiftError>((text, markdown))
        }
    }))
    .await;
    for (position, outcome) in images.into_iter().zip(recognized) {
        let work = &mut works[position];
        match outcome {
            Ok((text, _)) if text.is_empty() => {
                work.fail("empty_document: OCR found no text in the image");
            }
            Ok((text, markdown)) => {
                work.parsed = Some(ParsedDocument {
                    title: None,
                    text,
                    markdown,
                    encoding: "OCR",
                    pages: Vec::new(),
                    scanned_pages: Vec::new(),
                    pictures: Vec::new(),
                });
            }
            Err(error) if error.is_transient() => work.defer_for_ocr(deferred, &error),
            Err(error) => work.fail(format!("{}: {error}", error.code())),
        }
    }
}

/// Sends a document event with `parse_pages` as a PDF's pages are read.
fn parse_pages_report(meta: &MetaHandle, record: &DocumentRecord) -> PageReport {
    let meta = meta.clone();
    let event = DocumentEvent::parsing(record);
    PageReport::new(move |done, total| {
        let mut event = event.clone();
        event.parse_pages = Some(PageProgress { done, total });
        meta.send_progress(event);
    })
}

/// Reads the scanned pages of the PDFs among `works` with the KB's OCR engine, each
/// document's pages at once within the engine's node-wide bound, and puts their text among
/// the other pages in page order. A page is read from its image when one image covers it,
/// else rendered whole by `pdftoppm` when the node has it (a tiled scan, text drawn as
/// shapes), else from its one image if it has one. Pages left unread are counted in
/// `pages_needing_ocr`: every scanned page without an engine, and with one a page it
/// refuses or that has no image to read and cannot be rendered. An engine away (after its
/// retries) defers the document. The saved images are removed.
async fn recognize_scanned_pages(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: &mut [Work],
    deferred: &mut Deferred,
) {
    let ocr = &context.options.ocr;
    let engine = ocr.engine_for(&kb.settings.ocr).ok();
    let limits = ImageLimits::default();
    for work in works.iter_mut() {
        let scanned = match work.parsed.as_mut() {
            Some(parsed) if work.failure.is_none() => std::mem::take(&mut parsed.scanned_pages),
            _ => Vec::new(),
        };
        if !scanned.is_empty() {
            match engine {
                None => work.pages_needing_ocr += scanned.len() as u32,
                Some(engine) => {
                    let reading = ScanReading {
                        context,
                        engine,
                        language: &kb.settings.language,
                        limits: &limits,
                    };
                    read_scanned_pages(&reading, work, scanned, deferred).await;
                }
            }
        }
        // A PDF of blank pages: nothing had text, nothing to read.
        if work
            .parsed
            .as_ref()
            .is_some_and(|parsed| parsed.text.is_empty())
        {
            work.parsed = None;
            work.fail(
                "no_text_layer: no page of the PDF has text, nor an image that OCR could read",
            );
        }
        if let Some(folder) = work.ocr_folder.take() {
            let _ = tokio::fs::remove_dir_all(&folder).await;
        }
    }
}

/// Reads the pictures of the Word and PowerPoint documents among `works` with the KB's OCR
/// engine, a document's pictures at once within the engine's node-wide bound, and puts each
/// one's text where its marker paragraph stands. Without an engine, and for a picture the
/// engine refuses, the marker is removed and the picture counted in `pages_needing_ocr`. An
/// engine away (after its retries) defers the document.
async fn recognize_pictures(
    context: &Arc<NodeContext>,
    kb: &KbRecord,
    works: &mut [Work],
    deferred: &mut Deferred,
) {
    let ocr = &context.options.ocr;
    let engine = ocr.engine_for(&kb.settings.ocr).ok();
    for work in works.iter_mut() {
        let pictures = match work.parsed.as_mut() {
            Some(parsed) if work.failure.is_none() => std::mem::take(&mut parsed.pictures),
            _ => continue,
        };
        if pictures.is_empty() {
            continue;
        }
        let read: Vec<std::result::Result<String, OcrError>> = match engine {
            None => pictures
                .iter()
                .map(|_| {
                    Err(OcrError::Unavailable(
                        "no OCR engine for the knowledge base".into(),
                    ))
                })
                .collect(),
            Some(engine) => {
                join_all(pictures.iter().map(|picture| {
                    ocr.recognize(
                        engine,
                        &picture.bytes,
                        picture.media_type,
                        &kb.settings.language,
                    )
                }))
                .await
            }
        };
        if let Some(error) = read
            .iter()
            .find_map(|outcome| outcome.as_ref().err().filter(|error| error.is_transient()))
        {
            work.defer_for_ocr(deferred, error);
            continue;
        }
        let Some(parsed) = work.parsed.as_mut() else {
            continue;
        };
        let mut unread = 0u32;
        for (picture, outcome) in pictures.iter().zip(read) {
            let text = outcome.unwrap_or_else(|error| {
                if engine.is_some() {
                    warn!(document_id = %work.record.id, %error, "OCR refused a picture");
                }
                unread += 1;
                String::new()
            });
            parsed.replace_marker(&picture.marker, text.trim());
        }
        work.pages_needing_ocr += unread;
    }
}

/// What reads one document's scanned pages: the node, the KB's engine and language, the
/// image caps.
struct ScanReading<'a> {
    context: &'a Arc<NodeContext>,
    engine: OcrEngine,
    language: &'a str,
    limits: &'a ImageLimits,
}

/// Where a scanned page's text is read from.
enum PageSource<'a> {
    /// The page's image, saved by the parse.
    Image(&'a std::path::Path),
    /// The page rendered whole from the raw PDF.
    Render(&'a std::path::Path),
    /// Nothing: no image holds the page and it cannot be rendered here.
    Unreadable,
}

/// Where `page` is read from: its image when it covers the page, else the page rendered
/// when `raw_pdf` is given (the node renders pages), else its one image if any.
fn page_source<'a>(page: &'a ScannedPage, raw_pdf: Option<&'a std::path::Path>) -> PageSource<'a> {
    match (&page.image, raw_pdf) {
        (Some(image), _) if page.image_covers_page => PageSource::Image(image),
        (_, Some(pdf)) => PageSource::Render(pdf),
        (Some(image), None) => PageSource::Image(image),
        (None, None) => PageSource::Unreadable,
    }
}

/// [`recognize_scanned_pages`] for one document that has scanned pages and an engine.
async fn read_scanned_pages(
    reading: &ScanReading<'_>,
    work: &mut Work,
    scanned: Vec<ScannedPage>,
    deferred: &mut Deferred,
) {
    let context = reading.context;
    let ocr = &context.options.ocr;
    // pdftoppm reads the upload as stored.
    let raw_pdf = ocr
        .renders_pages()
        .then(|| context.raw.file_path(&work.record.id).ok())
        .flatten();
    let sources: Vec<PageSource> = scanned
        .iter()
        .map(|page| page_source(page, raw_pdf.as_deref()))
        .collect();
    let total = sources
        .iter()
        .filter(|source| !matches!(source, PageSource::Unreadable))
        .count() as u32;
    let done = std::sync::atomic::AtomicU32::new(0);
    let record = &work.record;
    let read = join_all(scanned.iter().zip(&sources).map(|(page, source)| async {
        let bytes = match source {
            PageSource::Image(path) => tokio::fs::read(path)
                .await
                .map_err(|e| SiftError::Storage(e.into()))?,
            PageSource::Render(pdf) => ocr.render_page(pdf, page.number, page.size_points).await?,
            PageSource::Unreadable => return Ok(None),
        };
        let media_type = check_image(&bytes, reading.limits)?.media_type;
        let text = ocr
            .recognize(reading.engine, &bytes, media_type, reading.language)
            .await?;
        let done = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut event = DocumentEvent::parsing(record);
        event.ocr_pages = Some(PageProgress { done, total });
        context.meta.send_progress(event);
        Ok::<_, SiftError>(Some(text))
    }))
    .await;
    let mut texts = Vec::new();
    let mut needing = 0u32;
    let mut refused: Option<SiftError> = None;
    for (page, outcome) in scanned.into_iter().zip(read) {
        match outcome {
            Ok(Some(text)) if !text.is_empty() => {
                texts.push((page.number, page.heading_path, text))
            }
            Ok(Some(_)) => {} // read, and blank
            Ok(None) => needing += 1,
            Err(error) if error.is_transient() => {
                work.defer_for_ocr(deferred, &error);
                return;
            }
            Err(error) => {
                warn!(document_id = %work.record.id, page = page.number, %error, "OCR refused a page");
                needing += 1;
                refused = Some(error);
            }
        }
    }
    work.pages_needing_ocr += needing;
    let Some(parsed) = work.parsed.as_mut() else {
        return;
    };
    insert_pages(parsed, texts);
    if parsed.text.is_empty() {
        work.parsed = None;
        work.fail(match refused {
            Some(error) => format!("{}: {error}", error.code()),
            None if needing > 0 => "no_text_layer: the PDF has no text layer, and its scanned \
                                    pages have no image OCR can read and cannot be rendered \
                                    on this node (pdftoppm is not installed)"
                .to_string(),
            None => "no_text_layer: the PDF has no text layer and OCR found no text on its \
                     scanned pages"
                .to_string(),
        });
    }
}

/// Puts recognised pages (number, heading path, text) among `parsed`'s pages, in page order,
/// rebuilding its text and page ranges.
fn insert_pages(parsed: &mut ParsedDocument, recognised: Vec<(u32, Vec<String>, String)>) {
    if recognised.is_empty() {
        return;
    }
    let mut all: Vec<(u32, Vec<String>, String)> = parsed
        .pages
        .iter()
        .map(|page| {
            (
                page.number,
                page.heading_path.clone(),
                parsed.text[page.start..page.end].to_string(),
            )
        })
        .chain(recognised)
        .collect();
    all.sort_by_key(|(number, _, _)| *number);
    let mut text = String::new();
    let mut pages = Vec::with_capacity(all.len());
    for (number, heading_path, page_text) in all {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        let start = text.len();
        text.push_str(&page_text);
        pages.push(Page {
            number,
            start,
            end: text.len(),
            heading_path,
        });
    }
    parsed.text = text;
    parsed.pages = pages;
}

/// The update that sends a document back to `queued` after a transient error; applying it
/// takes back the attempt mark its start made.
fn requeued(document_id: String) -> StatusUpdate {
    StatusUpdate {
        document_id,
        status: DocStatus::Queued,
        error: None,
        chunk_count: None,
        pages_needing_ocr: None,
    }
}

/// Moves the job's live, not-yet-failed documents to `status`; drops documents deleted meanwhile.
async fn set_stage(
    context: &NodeContext,
    kb: &KbRecord,
    works: Vec<Work>,
    status: DocStatus,
) -> Result<Vec<Work>> {
    let updates: Vec<StatusUpdate> = works
        .iter()
        .filter(|work| work.failure.is_none())
        .map(|work| StatusUpdate {
            document_id: work.record.id.clone(),
            status,
            error: None,
            chunk_count: None,
            pages_needing_ocr: None,
        })
        .collect();
    if updates.is_empty() {
        return Ok(works);
    }
    let outcome = context
        .meta
        .propose(MetaOp::SetDocumentStatus {
            kb_id: kb.id.clone(),
            updates,
            at_ms: now_ms(),
        })
        .await?;
    let MetaOutcome::Statuses(records) = outcome else {
        return Ok(works);
    };
    let live: std::collections::HashSet<String> = records.into_iter().map(|r| r.id).collect();
    Ok(works
        .into_iter()
        .filter(|work| work.failure.is_some() || live.contains(&work.record.id))
        .collect())
}

/// Marks every document of `job` that is not terminal as failed with `reason`.
pub async fn fail_unfinished(context: &NodeContext, job: &IngestJob, reason: &str) {
    fail_unfinished_documents(context, &job.kb_id, &job.document_ids, reason).await;
}

/// Marks the documents of `kb_id` among `document_ids` that are not terminal as failed.
async fn fail_unfinished_documents(
    context: &NodeContext,
    kb_id: &str,
    document_ids: &[String],
    reason: &str,
) {
    let store = context.meta.store();
    let updates: Vec<StatusUpdate> = document_ids
        .iter()
        .filter(|id| {
            matches!(store.get_document(kb_id, id), Ok(Some(record)) if !record.status.is_terminal())
        })
        .map(|id| StatusUpdate {
            document_id: id.clone(),
            status: DocStatus::Failed,
            error: Some(reason.to_string()),
            chunk_count: Some(0),
            pages_needing_ocr: None,
        })
        .collect();
    if updates.is_empty() {
        return;
    }
    metrics::counter!("sift_ingest_documents_total", "status" => "failed")
        .increment(updates.len() as u64);
    if let Err(error) = context
        .meta
        .propose(MetaOp::SetDocumentStatus {
            kb_id: kb_id.to_string(),
            updates,
            at_ms: now_ms(),
        })
        .await
    {
        warn!(%error, "could not mark documents failed");
    }
}

/// Runs one document's CPU stage, turning a panic (a bug) into that document's failure
/// instead of the whole job's.
fn unpanicked<T>(stage: &str, work: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
        let detail =
            crate::error::panic_message(panic.as_ref()).unwrap_or_else(|| "no message".into());
        metrics::counter!("sift_ingest_panics_total").increment(1);
        SiftError::Internal(format!("{stage} failed unexpectedly: {detail}"))
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn record_stage(stage: &'static str, started: Instant) {
    metrics::histogram!("sift_ingest_stage_seconds", "stage" => stage)
        .record(started.elapsed().as_secs_f64());
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| SiftError::Internal(format!("ingestion task failed: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(position: u32, parent_position: u32, bytes: usize) -> ChunkRecord {
        ChunkRecord {
            position,
            parent_position,
            text: "x".repeat(bytes),
            heading_path: Vec::new(),
            span: (0, 0),
            vector: Vec::new(),
            pages: None,
        }
    }

    fn parent(position: u32, bytes: usize) -> ParentRecord {
        ParentRecord {
            position,
            text: "p".repeat(bytes),
            span: (0, 0),
            pages: None,
        }
    }

    /// Every slice of `chunks` and `parents`, as (chunk positions, parent positions).
    fn slices(
        chunks: Vec<ChunkRecord>,
        parents: Vec<ParentRecord>,
        max_chunks: usize,
        max_bytes: usize,
    ) -> Vec<(Vec<u32>, Vec<u32>)> {
        let mut chunks = VecDeque::from(chunks);
        let mut parents = VecDeque::from(parents);
        let mut all = Vec::new();
        loop {
            let (slice, slice_parents) =
                next_slice(&mut chunks, &mut parents, max_chunks, max_bytes);
            if slice.is_empty() && slice_parents.is_empty() {
                return all;
            }
            all.push((
                slice.iter().map(|c| c.position).collect(),
                slice_parents.iter().map(|p| p.position).collect(),
            ));
        }
    }

    #[test]
    fn slices_hold_at_most_their_chunks_and_bytes_with_the_parents_they_name_first() {
        // Five chunks under two parents, three a slice.
        let chunks: Vec<_> = [0, 0, 0, 1, 1]
            .iter()
            .enumerate()
            .map(|(i, &p)| chunk(i as u32, p, 10))
            .collect();
        let parents = vec![parent(0, 30), parent(1, 20)];
        assert_eq!(
            slices(chunks.clone(), parents.clone(), 3, usize::MAX),
            [(vec![0, 1, 2], vec![0]), (vec![3, 4], vec![1])]
        );
        // By bytes: 40 at most (a chunk with the parent it names first counts both).
        assert_eq!(
            slices(chunks.clone(), parents.clone(), 100, 40),
            [
                (vec![0], vec![0]),
                (vec![1, 2], vec![]),
                (vec![3, 4], vec![1])
            ]
        );
        // A chunk bigger than the byte bound still goes, alone.
        assert_eq!(
            slices(
                vec![chunk(0, 0, 500), chunk(1, 0, 5)],
                vec![parent(0, 1)],
                10,
                100
            ),
            [(vec![0], vec![0]), (vec![1], vec![])]
        );
        // Parents no chunk names go with the last slice; nothing left: nothing more.
        assert_eq!(
            slices(
                vec![chunk(0, 0, 1)],
                vec![parent(0, 1), parent(1, 1)],
                10,
                100
            ),
            [(vec![0], vec![0, 1])]
        );
        assert!(slices(Vec::new(), Vec::new(), 10, 100).is_empty());
    }

    #[test]
    fn a_document_is_large_by_its_chunks_or_by_its_text() {
        let write = |chunks: usize, bytes: usize| DocumentWrite {
            entry: DocumentEntry {
                document_id: "d".into(),
                external_id: None,
                title: String::new(),
                metadata: Default::default(),
            },
            parents: vec![parent(0, 1)],
            chunks: (0..chunks).map(|i| chunk(i as u32, 0, bytes)).collect(),
        };
        assert!(!is_large(&write(4, 10), 4));
        assert!(is_large(&write(5, 10), 4));
        assert!(is_large(&write(2, SLICE_BYTES), 4));
    }
}
