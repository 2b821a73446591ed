//! Context expansion and packing: each final hit grows to its parent chunk (small-to-big)
//! or to its previous/next chunks, and the grown texts are packed, best hit first, into a
//! token budget (cl100k) with numbered, deduplicated citations. When the expansion asked for
//! does not fit, a hit's text is trimmed (parent → chunk with neighbours → chunk alone), then
//! hits are left out, and `trimmed` and `notes` say so.

use serde::Serialize;
use sift_storage::chunk::ChunkView;

use super::root::SearchHit;

/// A neighbour chunk attached to a hit.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Neighbour {
    pub chunk_id: String,
    pub position: u32,
    pub text: String,
}

/// A numbered source of the packed `context`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ContextCitation)]
pub struct Citation {
    /// The number used in `text` (`[n]`).
    pub n: usize,
    pub document_id: String,
    pub external_id: Option<String>,
    /// The page the document was fetched from, after redirects (`sift.source_url`), for a
    /// document added by URL; else `null`.
    pub source_url: Option<String>,
    pub title: String,
    /// The hits (by chunk id) this citation covers.
    pub chunk_ids: Vec<String>,
    /// The pages of the hit's chunk (PDF), else `null`.
    pub pages: Option<sift_storage::chunk::PageRange>,
    /// `parent`, `neighbours` or `chunk`: what of the hit was packed.
    #[schema(value_type = String)]
    pub expansion: &'static str,
    pub tokens: usize,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct PackedContext {
    pub text: String,
    pub tokens: usize,
    pub budget: usize,
    pub citations: Vec<Citation>,
    /// True when some expansion or some hit did not fit the budget.
    pub trimmed: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

pub fn count_tokens(text: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// Forms of a hit's text, widest first: (`expansion`, text).
fn forms(hit: &SearchHit, expand_parent: bool) -> Vec<(&'static str, String)> {
    let mut forms = Vec::new();
    if expand_parent
        && let Some(parent) = &hit.chunk.parent_text
        && parent.len() > hit.chunk.text.len()
    {
        forms.push(("parent", parent.clone()));
    }
    if !hit.neighbours.is_empty() {
        let mut parts: Vec<&str> = hit
            .neighbours
            .iter()
            .filter(|n| n.position < hit.chunk.position)
            .map(|n| n.text.as_str())
            .collect();
        parts.push(&hit.chunk.text);
        parts.extend(
            hit.neighbours
                .iter()
                .filter(|n| n.position > hit.chunk.position)
                .map(|n| n.text.as_str()),
        );
        forms.push(("neighbours", parts.join("\n")));
    }
    forms.push(("chunk", hit.chunk.text.clone()));
    forms
}

fn heading(chunk: &ChunkView) -> String {
    let mut parts = vec![chunk.title.clone()];
    parts.extend(chunk.heading_path.iter().cloned());
    parts.retain(|p| !p.is_empty());
    parts.join(" > ")
}

/// Packs `hits` (best first) into `budget` tokens; sets each packed hit's `citation`.
pub fn pack(hits: &mut [SearchHit], expand_parent: bool, budget: usize) -> PackedContext {
    let mut citations: Vec<Citation> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    let mut used = 0usize;
    let mut trimmed_hits = 0usize;
    let mut left_out = 0usize;
    for hit in hits.iter_mut() {
        let forms = forms(hit, expand_parent);
        // The same packed text (two children of one parent, or a duplicate) is cited once.
        if let Some(index) = texts.iter().position(|t| forms.iter().any(|(_, f)| f == t)) {
            citations[index].chunk_ids.push(hit.chunk.chunk_id.clone());
            hit.citation = Some(citations[index].n);
            hit.trace
                .push(format!("context: shares citation [{}]", index + 1));
            continue;
        }
        let n = citations.len() + 1;
        let label = format!("[{n}] {}\n", heading(&hit.chunk));
        let separator = if texts.is_empty() { 0 } else { 1 };
        let label_tokens = count_tokens(&label) + separator;
        let fitted = forms.iter().enumerate().find_map(|(i, (kind, text))| {
            let tokens = count_tokens(text);
            (used + label_tokens + tokens <= budget).then_some((i, *kind, text.clone(), tokens))
        });
        match fitted {
            Some((i, kind, text, tokens)) => {
                if i > 0 {
                    trimmed_hits += 1;
                    hit.trace.push(format!(
                        "context: trimmed from {} to {kind} to fit the budget",
                        forms[0].0
                    ));
                } else {
                    hit.trace.push(format!("context: packed as {kind} [{n}]"));
                }
                used += label_tokens + tokens;
                hit.citation = Some(n);
                citations.push(Citation {
                    n,
                    document_id: hit.chunk.document_id.clone(),
                    external_id: hit.chunk.external_id.clone(),
                    source_url: sift_storage::chunk::source_url(&hit.chunk.metadata)
                        .map(str::to_string),
                    title: hit.chunk.title.clone(),
                    chunk_ids: vec![hit.chunk.chunk_id.clone()],
                    pages: hit.chunk.pages,
                    expansion: kind,
                    tokens,
                });
                texts.push(text);
            }
            None => {
                left_out += 1;
                hit.trace
                    .push("context: left out (budget full)".to_string());
            }
        }
    }
    let mut notes = Vec::new();
    if trimmed_hits > 0 {
        notes.push(format!(
            "{trimmed_hits} hits packed with less expansion than asked, to fit {budget} tokens"
        ));
    }
    if left_out > 0 {
        notes.push(format!(
            "{left_out} hits left out of the context: the {budget}-token budget is full"
        ));
    }
    let text = citations
        .iter()
        .zip(&texts)
        .map(|(citation, text)| {
            let chunk = hits
                .iter()
                .find(|h| h.citation == Some(citation.n))
                .map(|h| heading(&h.chunk))
                .unwrap_or_default();
            format!("[{}] {chunk}\n{text}", citation.n)
        })
        .collect::<Vec<_>>()
        .join("\n\n");
    PackedContext {
        tokens: count_tokens(&text),
        text,
        budget,
        citations,
        trimmed: trimmed_hits > 0 || left_out > 0,
        notes,
    }
}
