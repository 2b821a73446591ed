//! Deep reading: `grep_chunks` (literal or regex, per document or across the run's KBs, with
//! bounded work and output), `list_chunks`, `read_chunk` (with neighbours) and
//! `read_document` (the outline by heading path). Documents are looked up only in the run's
//! KBs.

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use sift_storage::chunk::ChunkView;
use sift_storage::meta::{DocStatus, DocumentRecord};

use super::{GREP_CHUNKS, READ_CHUNK, ToolContext, ToolError, ToolOutput, select_kbs};
use crate::agent::HitRef;
use crate::agent::evidence::EvidenceChunk;
use crate::agent::terms::truncate_chars;

/// Longest pattern `grep_chunks` accepts.
pub const MAX_PATTERN_CHARS: usize = 200;
/// Documents one KB-wide grep scans at most.
pub const MAX_GREP_DOCUMENTS: usize = 200;
/// Chunks one grep scans at most.
pub const MAX_GREP_CHUNKS: usize = 5000;
pub const DEFAULT_GREP_RESULTS: usize = 10;
pub const MAX_GREP_RESULTS: usize = 20;
/// Compiled-regex size limit: a hostile pattern cannot take unbounded memory or time (the
/// regex crate matches in linear time).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
const SNIPPET_CHARS: usize = 160;
const READ_CHARS: usize = 4000;

fn bad(tool: &str, message: impl Into<String>) -> ToolError {
    ToolError::BadArguments {
        tool: tool.into(),
        message: message.into(),
    }
}

/// Finds a document (by id or external id) in the run's KBs.
async fn find_document(
    context: &ToolContext<'_>,
    document: &str,
) -> Result<DocumentRecord, ToolError> {
    for kb in context.kbs {
        if let Ok(record) = context.corpus.get_document(kb, document) {
            return Ok(record);
        }
    }
    Err(ToolError::Failed(format!(
        "no document {:?} in this run's knowledge bases",
        truncate_chars(document, 80)
    )))
}

async fn chunks_of(
    context: &ToolContext<'_>,
    record: &DocumentRecord,
) -> Result<Vec<ChunkView>, ToolError> {
    context
        .corpus
        .document_chunks(&record.kb_id, &record.id)
        .await
        .map_err(|error| ToolError::Failed(format!("reading document {}: {error}", record.id)))
}

fn read_evidence(kb_id: &str, chunk: &ChunkView) -> EvidenceChunk {
    EvidenceChunk {
        kb_id: kb_id.to_string(),
        chunk: chunk.clone(),
        relevance: 0.0,
        score: 0.0,
        searched: false,
    }
}

fn hit_ref(chunk: &ChunkView) -> HitRef {
    HitRef {
        chunk_id: chunk.chunk_id.clone(),
        document_id: chunk.document_id.clone(),
        title: chunk.title.clone(),
        score: 0.0,
    }
}

#[derive(Debug, Deserialize)]
pub struct GrepArgs {
    pub pattern: String,
    #[serde(default)]
    pub regex: bool,
    #[serde(default)]
    pub document_id: Option<String>,
    #[serde(default)]
    pub kb: Option<String>,
    #[serde(default)]
    pub max_results: Option<usize>,
}

/// Compiles a grep pattern: case-insensitive, size-limited.
pub fn compile_pattern(pattern: &str, is_regex: bool) -> Result<Regex, ToolError> {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err(bad(GREP_CHUNKS, "pattern is empty"));
    }
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        return Err(bad(
            GREP_CHUNKS,
            format!("pattern is longer than {MAX_PATTERN_CHARS} characters"),
        ));
    }
    let source = if is_regex {
        pattern.to_string()
    } else {
        regex::escape(pattern)
    };
    RegexBuilder::new(&source)
        .case_insensitive(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|error| bad(GREP_CHUNKS, format!("invalid regular expression: {error}")))
}

pub async fn grep_chunks(
    context: &ToolContext<'_>,
    args: GrepArgs,
) -> Result<ToolOutput, ToolError> {
    let matcher = compile_pattern(&args.pattern, args.regex)?;
    let max_results = args
        .max_results
        .unwrap_or(DEFAULT_GREP_RESULTS)
        .clamp(1, MAX_GREP_RESULTS);
    let mut documents: Vec<DocumentRecord> = Vec::new();
    let mut truncated_documents = false;
    match &args.document_id {
        Some(document) => documents.push(find_document(context, document).await?),
        None => {
            for kb in select_kbs(context, args.kb.as_deref())? {
                let mut after: Option<String> = None;
                loop {
                    let page = context
                        .corpus
                        .list_documents(&kb, after.as_deref(), 100)
                        .map_err(|error| ToolError::Failed(error.to_string()))?;
                    documents.extend(
                        page.documents
                            .into_iter()
                            .filter(|d| d.status == DocStatus::Ready),
                    );
                    if documents.len() >= MAX_GREP_DOCUMENTS {
                        truncated_documents = true;
                        documents.truncate(MAX_GREP_DOCUMENTS);
                        break;
                    }
                    match page.next_after {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
            }
        }
    }
    let mut scanned = 0usize;
    let mut matches: Vec<(EvidenceChunk, String)> = Vec::new();
    let mut truncated_chunks = false;
    'documents: for record in &documents {
        let chunks = chunks_of(context, record).await?;
        for chunk in chunks {
            if scanned >= MAX_GREP_CHUNKS {
                truncated_chunks = true;
                break 'documents;
            }
            scanned += 1;
            if let Some(found) = matcher.find(&chunk.text) {
                let snippet = snippet_around(&chunk.text, found.start(), found.end());
                matches.push((read_evidence(&record.kb_id, &chunk), snippet));
                if matches.len() >= max_results {
                    break 'documents;
                }
            }
        }
    }
    let mut content = format!(
        "{} match(es) for {} {:?} in {} chunk(s) of {} document(s)",
        matches.len(),
        if args.regex { "regex" } else { "literal" },
        truncate_chars(&args.pattern, 80),
        scanned,
        documents.len()
    );
    if matches.len() >= max_results {
        content.push_str(&format!(" (stopped at {max_results} matches)"));
    }
    if truncated_documents || truncated_chunks {
        content.push_str(" (scan limit reached: narrow it with document_id)");
    }
    content.push_str(".\n");
    for (index, (evidence, snippet)) in matches.iter().enumerate() {
        let chunk = &evidence.chunk;
        content.push_str(&format!(
            "\nMatch {}: chunk_id: {} | document: {:?} (document_id {}, position {})\n…{}…\n",
            index + 1,
            chunk.chunk_id,
            chunk.title,
            chunk.document_id,
            chunk.position,
            snippet
        ));
    }
    Ok(ToolOutput {
        summary: format!(
            "{} match(es) for {:?}",
            matches.len(),
            truncate_chars(&args.pattern, 80)
        ),
        content,
        hits: matches.iter().map(|(e, _)| hit_ref(&e.chunk)).collect(),
        chunks: matches.into_iter().map(|(e, _)| e).collect(),
        ..ToolOutput::default()
    })
}

/// Up to `SNIPPET_CHARS` characters around the byte range `[start, end)` of `text`.
fn snippet_around(text: &str, start: usize, end: usize) -> String {
    let before: String = {
        let chars: Vec<char> = text[..start]
            .chars()
            .rev()
            .take(SNIPPET_CHARS / 2)
            .collect();
        chars.into_iter().rev().collect()
    };
    let matched: String = text[start..end].chars().take(SNIPPET_CHARS).collect();
    let after: String = text[end..].chars().take(SNIPPET_CHARS / 2).collect();
    format!("{before}{matched}{after}").replace('\n', " ")
}

#[derive(Debug, Deserialize)]
pub struct ListArgs {
    pub document_id: String,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub limit: Option<usize>,
}

pub async fn list_chunks(
    context: &ToolContext<'_>,
    args: ListArgs,
) -> Result<ToolOutput, ToolError> {
    let record = find_document(context, &args.document_id).await?;
    let chunks = chunks_of(context, &record).await?;
    let offset = args.offset.unwrap_or(0);
    let limit = args.limit.unwrap_or(20).clamp(1, 30);
    let shown: Vec<&ChunkView> = chunks.iter().skip(offset).take(limit).collect();
    let mut content = format!(
        "Document {:?} (document_id {}) has {} chunk(s); showing {} from position {offset}.\n",
        record.title,
        record.id,
        chunks.len(),
        shown.len()
    );
    for chunk in &shown {
        let section = if chunk.heading_path.is_empty() {
            String::new()
        } else {
            format!(" [{}]", chunk.heading_path.join(" › "))
        };
        content.push_str(&format!(
            "- position {} chunk_id: {}{section}: {}\n",
            chunk.position,
            chunk.chunk_id,
            truncate_chars(&chunk.text.replace('\n', " "), 150)
        ));
    }
    Ok(ToolOutput {
        summary: format!(
            "{} of {} chunk(s) of {:?}",
            shown.len(),
            chunks.len(),
            record.title
        ),
        content,
        hits: shown.iter().map(|c| hit_ref(c)).collect(),
        chunks: shown
            .iter()
            .map(|c| read_evidence(&record.kb_id, c))
            .collect(),
        ..ToolOutput::default()
    })
}

#[derive(Debug, Deserialize)]
pub struct ReadArgs {
    #[serde(default)]
    pub chunk_id: Option<String>,
    #[serde(default)]
    pub document_id: Option<String>,
    #[serde(default)]
    pub position: Option<u32>,
    #[serde(default)]
    pub neighbours: Option<u32>,
}

pub async fn read_chunk(
    context: &ToolContext<'_>,
    args: ReadArgs,
) -> Result<ToolOutput, ToolError> {
    let (document, position) = match (&args.chunk_id, &args.document_id, args.position) {
        (Some(chunk_id), _, _) => {
            let (document, position) = chunk_id
                .trim()
                .rsplit_once('#')
                .and_then(|(d, p)| p.parse::<u32>().ok().map(|p| (d.to_string(), p)))
                .ok_or_else(|| {
                    bad(
                        READ_CHUNK,
                        "chunk_id must look like {document_id}#{position}",
                    )
                })?;
            (document, position)
        }
        (None, Some(document), Some(position)) => (document.clone(), position),
        _ => {
            return Err(bad(
                READ_CHUNK,
                "give chunk_id, or document_id and position",
            ));
        }
    };
    let neighbours = args.neighbours.unwrap_or(1).min(3);
    let record = find_document(context, &document).await?;
    let chunks = chunks_of(context, &record).await?;
    let Some(index) = chunks.iter().position(|c| c.position == position) else {
        return Err(ToolError::Failed(format!(
            "document {} has no chunk at position {position} (it has {})",
            record.id,
            chunks.len()
        )));
    };
    let from = index.saturating_sub(neighbours as usize);
    let to = (index + neighbours as usize + 1).min(chunks.len());
    let shown = &chunks[from..to];
    let mut content = format!(
        "Document {:?} (document_id {}), chunks {}..={} of {}:\n",
        record.title,
        record.id,
        shown.first().map(|c| c.position).unwrap_or(position),
        shown.last().map(|c| c.position).unwrap_or(position),
        chunks.len()
    );
    for chunk in shown {
        let section = if chunk.heading_path.is_empty() {
            String::new()
        } else {
            format!(" | section: {}", chunk.heading_path.join(" › "))
        };
        content.push_str(&format!(
            "\n{} chunk_id: {} (position {}){section}\n{}\n",
            if chunk.position == position {
                ">>"
            } else {
                "--"
            },
            chunk.chunk_id,
            chunk.position,
            truncate_chars(chunk.text.trim(), READ_CHARS)
        ));
    }
    Ok(ToolOutput {
        summary: format!(
            "read {} chunk(s) around {}#{position}",
            shown.len(),
            record.id
        ),
        content,
        hits: shown.iter().map(hit_ref).collect(),
        chunks: shown
            .iter()
            .map(|c| read_evidence(&record.kb_id, c))
            .collect(),
        ..ToolOutput::default()
    })
}

#[derive(Debug, Deserialize)]
pub struct DocumentArgs {
    pub document_id: String,
}

pub async fn read_document(
    context: &ToolContext<'_>,
    args: DocumentArgs,
) -> Result<ToolOutput, ToolError> {
    let record = find_document(context, &args.document_id).await?;
    let chunks = chunks_of(context, &record).await?;
    let mut content = format!(
        "Document {:?} (document_id {}{}), {} chunk(s). Outline (section: chunk positions):\n",
        record.title,
        record.id,
        record
            .external_id
            .as_deref()
            .map(|e| format!(", external id {e}"))
            .unwrap_or_default(),
        chunks.len()
    );
    let mut sections: Vec<(String, u32, u32)> = Vec::new();
    for chunk in &chunks {
        let path = if chunk.heading_path.is_empty() {
            "(no heading)".to_string()
        } else {
            chunk.heading_path.join(" › ")
        };
        match sections.last_mut() {
            Some((last, _, end)) if *last == path => *end = chunk.position,
            _ => sections.push((path, chunk.position, chunk.position)),
        }
    }
    for (path, start, end) in sections.iter().take(200) {
        if start == end {
            content.push_str(&format!("- {path}: {start}\n"));
        } else {
            content.push_str(&format!("- {path}: {start}-{end}\n"));
        }
    }
    if sections.len() > 200 {
        content.push_str(&format!("… {} more sections\n", sections.len() - 200));
    }
    Ok(ToolOutput {
        summary: format!(
            "outline of {:?}: {} section(s), {} chunk(s)",
            record.title,
            sections.len(),
            chunks.len()
        ),
        content,
        ..ToolOutput::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_bounded_and_checked() {
        assert!(compile_pattern("a.b", false).unwrap().is_match("A.B"));
        assert!(!compile_pattern("a.b", false).unwrap().is_match("axb"));
        assert!(compile_pattern("a.b", true).unwrap().is_match("axb"));
        assert_eq!(
            compile_pattern("(", true).unwrap_err().status(),
            "bad_arguments"
        );
        assert!(compile_pattern(&"x".repeat(201), false).is_err());
        assert!(compile_pattern("  ", false).is_err());
        // A pattern whose automaton would be huge is refused, not compiled.
        assert!(compile_pattern(r"\w{1000}\w{1000}\w{1000}", true).is_err());
    }

    #[test]
    fn snippets_are_short_and_char_safe() {
        let text = format!("{}needle{}", "é".repeat(300), "ü".repeat(300));
        let start = text.find("needle").unwrap();
        let snippet = snippet_around(&text, start, start + 6);
        assert!(snippet.contains("needle"));
        assert!(snippet.chars().count() <= SNIPPET_CHARS + 6);
    }
}
