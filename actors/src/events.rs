//! Document progress events, broadcast to SSE subscribers.

use serde::Serialize;
use sift_storage::meta::{DocStatus, DocumentRecord};

#[derive(Clone, Debug, Serialize)]
pub struct DocumentEvent {
    pub kb_id: String,
    pub document_id: String,
    pub status: DocStatus,
    pub error: Option<String>,
    pub chunk_count: u32,
    /// Share of the pipeline done, 0.0 to 1.0.
    pub progress: f32,
    /// Set when the document was deleted.
    pub deleted: bool,
    /// Parts indexed without their text (a PDF's scanned pages, a Word or PowerPoint file's
    /// pictures): it needs OCR and none read it.
    pub pages_needing_ocr: u32,
    /// While scanned pages are read by OCR (status `parsing`): how many of how many are done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ocr_pages: Option<PageProgress>,
    /// While a PDF's pages are read (status `parsing`): how many of how many are done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_pages: Option<PageProgress>,
    /// While a document of many chunks is embedded and written in slices (status
    /// `embedding`): how many of its chunks are done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedded_chunks: Option<PageProgress>,
}

/// Items (pages, chunks) done of a stage that goes step by step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PageProgress {
    pub done: u32,
    pub total: u32,
}

impl DocumentEvent {
    pub fn from_record(record: &DocumentRecord) -> Self {
        DocumentEvent {
            kb_id: record.kb_id.clone(),
            document_id: record.id.clone(),
            status: record.status,
            error: record.error.clone(),
            chunk_count: record.chunk_count,
            progress: progress(record.status),
            deleted: false,
            pages_needing_ocr: record.pages_needing_ocr,
            ocr_pages: None,
            parse_pages: None,
            embedded_chunks: None,
        }
    }

    /// An event of `record` in its parsing stage (OCR and parse progress are set on it).
    pub fn parsing(record: &DocumentRecord) -> Self {
        DocumentEvent {
            status: DocStatus::Parsing,
            progress: progress(DocStatus::Parsing),
            ..DocumentEvent::from_record(record)
        }
    }

    /// Whether no further event will follow for this document.
    pub fn is_final(&self) -> bool {
        self.deleted || self.status.is_terminal()
    }
}

pub fn progress(status: DocStatus) -> f32 {
    match status {
        DocStatus::Queued => 0.0,
        DocStatus::Parsing => 0.1,
        DocStatus::Chunking => 0.2,
        DocStatus::Embedding => 0.3,
        DocStatus::Indexing => 0.8,
        DocStatus::Ready | DocStatus::Failed => 1.0,
    }
}
