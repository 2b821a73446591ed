//! The evidence of a run: every chunk a tool returned, and the only chunks an answer may cite.
//!
//! [`build_answer`] turns the model's `final_answer` into the answer the user sees: cited ids
//! that no tool returned are dropped (and reported for the trace), the rest are numbered by
//! first use, and the text's markers (`[chunk_id]`, `[chunk_id, chunk_id]`, or `[k]` for the
//! k-th id of the citation list) become `[n]`. Citations the text never marks are appended as
//! markers at the end, so every citation is visible in the text.

use std::collections::HashMap;

use regex::Regex;
use sift_storage::chunk::ChunkView;

use super::Citation;

/// A chunk a tool returned in this run.
#[derive(Clone, Debug)]
pub struct EvidenceChunk {
    pub kb_id: String,
    pub chunk: ChunkView,
    /// Relevance in [0, 1] for search hits; 0 for chunks read directly.
    pub relevance: f64,
    /// The fused search score (0 for chunks read directly).
    pub score: f64,
    /// Found by a search (as opposed to read, listed or grepped).
    pub searched: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Evidence {
    chunks: HashMap<String, EvidenceChunk>,
    order: Vec<String>,
}

impl Evidence {
    /// Adds a chunk, keeping the better relevance of a chunk seen twice.
    pub fn insert(&mut self, chunk: EvidenceChunk) {
        let id = chunk.chunk.chunk_id.clone();
        match self.chunks.get_mut(&id) {
            Some(known) => {
                if chunk.relevance > known.relevance {
                    known.relevance = chunk.relevance;
                    known.score = chunk.score;
                }
                known.searched |= chunk.searched;
            }
            None => {
                self.order.push(id.clone());
                self.chunks.insert(id, chunk);
            }
        }
    }

    pub fn get(&self, chunk_id: &str) -> Option<&EvidenceChunk> {
        self.chunks.get(chunk_id)
    }

    pub fn contains(&self, chunk_id: &str) -> bool {
        self.chunks.contains_key(chunk_id)
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Chunks in the order tools first returned them.
    pub fn in_order(&self) -> impl Iterator<Item = &EvidenceChunk> {
        self.order.iter().filter_map(|id| self.chunks.get(id))
    }

    /// The most relevant chunk of `document_id` among the evidence (for answers that cite a
    /// document instead of a chunk).
    pub fn best_of_document(&self, document_id: &str) -> Option<&EvidenceChunk> {
        self.in_order()
            .filter(|c| c.chunk.document_id == document_id)
            .max_by(|a, b| a.relevance.total_cmp(&b.relevance))
    }

    /// The `n` most relevant searched chunks, best first (then read ones in order).
    pub fn best(&self, n: usize) -> Vec<&EvidenceChunk> {
        let mut searched: Vec<&EvidenceChunk> = self.in_order().filter(|c| c.searched).collect();
        searched.sort_by(|a, b| b.relevance.total_cmp(&a.relevance));
        searched.extend(self.in_order().filter(|c| !c.searched));
        searched.truncate(n);
        searched
    }
}

/// A citation of a whole chunk.
pub fn citation_for(n: u32, evidence: &EvidenceChunk) -> Citation {
    let chunk = &evidence.chunk;
    Citation {
        n,
        chunk_id: chunk.chunk_id.clone(),
        kb_id: evidence.kb_id.clone(),
        document_id: chunk.document_id.clone(),
        document_title: chunk.title.clone(),
        external_id: chunk.external_id.clone(),
        source_url: sift_storage::chunk::source_url(&chunk.metadata).map(str::to_string),
        span: chunk.span,
        pages: chunk.pages,
        text: chunk.text.clone(),
        heading_path: chunk.heading_path.clone(),
    }
}

/// The answer as shown, with its citations.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltAnswer {
    pub text: String,
    pub citations: Vec<Citation>,
    /// Cited ids that no tool returned in this run (dropped).
    pub dropped: Vec<String>,
}

fn marker_regex() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| Regex::new(r"[\[【]([^\[\]【】\n]{1,600})[\]】]").expect("valid regex"))
}

/// Whether `item` looks like a chunk id (`{document}#{position}`).
fn looks_like_chunk_id(item: &str) -> bool {
    item.rsplit_once('#').is_some_and(|(doc, pos)| {
        !doc.is_empty() && !pos.is_empty() && pos.chars().all(|c| c.is_ascii_digit())
    }) && !item.contains(char::is_whitespace)
}

fn clean_item(item: &str) -> &str {
    let item = item.trim().trim_matches(['`', '"', '\'']);
    let item = ["chunk_id:", "chunk_id=", "chunk:", "chunk "]
        .iter()
        .find_map(|prefix| item.strip_prefix(prefix))
        .unwrap_or(item);
    item.trim()
}

/// Builds the shown answer from the model's text and the ids it cited (see the module docs).
pub fn build_answer(raw: &str, cited: &[String], evidence: &Evidence) -> BuiltAnswer {
    let cited: Vec<String> = cited.iter().map(|c| clean_item(c).to_string()).collect();
    let mut numbering: Vec<String> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    let (text, _) = rewrite_markers(raw, &cited, evidence, &mut numbering, &mut dropped, &|_| {
        true
    });
    let mut text = text.trim().to_string();
    let mut appended = String::new();
    let cited = resolve_cited(cited, evidence);
    for id in &cited {
        if evidence.contains(id) {
            if !numbering.contains(id) {
                appended.push_str(&format!("[{}]", number_of(id, &mut numbering)));
            }
        } else {
            note_dropped(id, &mut dropped);
        }
    }
    if !appended.is_empty() {
        text.push(' ');
        text.push_str(&appended);
    }
    let citations = numbering
        .iter()
        .enumerate()
        .filter_map(|(index, id)| {
            evidence
                .get(id)
                .map(|chunk| citation_for(index as u32 + 1, chunk))
        })
        .collect();
    BuiltAnswer {
        text,
        citations,
        dropped,
    }
}

/// The cited ids as evidence chunk ids where they can be: a cited document id stands for its
/// best chunk in the evidence; an id with stray characters around it (`id]}`, `id.`) for the
/// id. Ids that stay unresolved are kept as they are (the caller drops them).
pub(crate) fn resolve_cited(cited: Vec<String>, evidence: &Evidence) -> Vec<String> {
    cited
        .into_iter()
        .map(|id| {
            if evidence.contains(&id) {
                return id;
            }
            if let Some(best) = evidence.best_of_document(&id) {
                return best.chunk.chunk_id.clone();
            }
            embedded_id(&id, evidence).unwrap_or(id)
        })
        .collect()
}

/// The number of `id` in `numbering` (1-based), numbering it when new.
pub(crate) fn number_of(id: &str, numbering: &mut Vec<String>) -> u32 {
    match numbering.iter().position(|known| known == id) {
        Some(at) => at as u32 + 1,
        None => {
            numbering.push(id.to_string());
            numbering.len() as u32
        }
    }
}

fn note_dropped(id: &str, dropped: &mut Vec<String>) {
    if !dropped.iter().any(|d| d == id) {
        dropped.push(id.to_string());
    }
}

/// The ids of `cited` cleaned of the prefixes and quotes models put around them.
pub(crate) fn clean_cited(cited: &[String]) -> Vec<String> {
    cited.iter().map(|c| clean_item(c).to_string()).collect()
}

/// Rewrites the citation markers of `raw`: an item that resolves to an evidence chunk which
/// `keep` accepts becomes `[n]` (numbered in `numbering` by first use); other recognised items
/// are removed (ids no tool returned are noted in `dropped`); bracketed text that is no marker
/// stays. Returns the text and every evidence chunk the markers resolved to, in order (kept or
/// not). `cited` is the model's cleaned citation list (`[k]` means its k-th id).
pub(crate) fn rewrite_markers(
    raw: &str,
    cited: &[String],
    evidence: &Evidence,
    numbering: &mut Vec<String>,
    dropped: &mut Vec<String>,
    keep: &dyn Fn(&str) -> bool,
) -> (String, Vec<String>) {
    let mut resolved_ids: Vec<String> = Vec::new();
    let mut text = String::with_capacity(raw.len());
    let mut last = 0;
    for captures in marker_regex().captures_iter(raw) {
        let whole = captures.get(0).expect("match");
        // A markdown link `[text](url)` is not a marker.
        if raw[whole.end()..].starts_with('(') {
            continue;
        }
        let items: Vec<&str> = captures[1]
            .split([',', ';', '，'])
            .map(clean_item)
            .collect();
        let mut markers = String::new();
        let mut recognised = 0;
        for item in &items {
            let resolved = if evidence.contains(item) {
                Some(Ok(item.to_string()))
            } else if let Some(best) = evidence.best_of_document(item) {
                Some(Ok(best.chunk.chunk_id.clone()))
            } else if let Ok(k) = item.parse::<usize>() {
                match cited.get(k.wrapping_sub(1)) {
                    Some(id) if evidence.contains(id) => Some(Ok(id.clone())),
                    Some(id) => Some(Err(id.clone())),
                    None => Some(Err(item.to_string())),
                }
            } else if let Some(found) = embedded_id(item, evidence) {
                Some(Ok(found))
            } else if looks_like_chunk_id(item) {
                Some(Err(item.to_string()))
            } else {
                None
            };
            match resolved {
                Some(Ok(id)) => {
                    recognised += 1;
                    if keep(&id) {
                        let n = number_of(&id, numbering);
                        if !markers.contains(&format!("[{n}]")) {
                            markers.push_str(&format!("[{n}]"));
                        }
                    }
                    if !resolved_ids.contains(&id) {
                        resolved_ids.push(id);
                    }
                }
                Some(Err(id)) => {
                    recognised += 1;
                    if looks_like_chunk_id(&id) {
                        note_dropped(&id, dropped);
                    }
                }
                None => {}
            }
        }
        if recognised == 0 {
            continue; // ordinary bracketed text
        }
        let mut before = &raw[last..whole.start()];
        if markers.is_empty() {
            before = before.trim_end_matches(' ');
        }
        text.push_str(before);
        text.push_str(&markers);
        last = whole.end();
    }
    text.push_str(&raw[last..]);
    (text, resolved_ids)
}

/// The evidence chunk id written inside `item` with stray characters around it (a real 0.5B
/// model cited `"{id}]}"` and `"{id}."`): the longest id found whose position number is not
/// followed by another digit (`doc#1` is not in `doc#12`).
fn embedded_id(item: &str, evidence: &Evidence) -> Option<String> {
    evidence
        .in_order()
        .map(|c| c.chunk.chunk_id.as_str())
        .filter(|id| {
            item.match_indices(id).any(|(at, _)| {
                !item[at + id.len()..]
                    .chars()
                    .next()
                    .is_some_and(|next| next.is_ascii_digit())
            })
        })
        .max_by_key(|id| id.len())
        .map(str::to_string)
}

/// Chunk ids of `evidence` mentioned anywhere in `text` (for answers written as plain text).
pub fn mentioned_ids(text: &str, evidence: &Evidence) -> Vec<String> {
    let mut out: Vec<(usize, String)> = evidence
        .in_order()
        .filter_map(|c| {
            text.find(&c.chunk.chunk_id)
                .map(|at| (at, c.chunk.chunk_id.clone()))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn chunk(document: &str, position: u32, text: &str) -> EvidenceChunk {
        EvidenceChunk {
            kb_id: "kb".into(),
            chunk: ChunkView {
                chunk_id: format!("{document}#{position}"),
                document_id: document.into(),
                external_id: None,
                title: format!("title of {document}"),
                position,
                text: text.into(),
                parent_text: None,
                heading_path: Vec::new(),
                span: (position * 100, position * 100 + text.chars().count() as u32),
                pages: None,
                metadata: Default::default(),
            },
            relevance: 0.5,
            score: 1.0,
            searched: true,
        }
    }

    fn evidence() -> Evidence {
        let mut evidence = Evidence::default();
        evidence.insert(chunk("doc-a", 0, "alpha"));
        evidence.insert(chunk("doc-b", 3, "beta"));
        evidence
    }

    #[test]
    fn ids_in_text_become_numbers_and_unreturned_ids_are_dropped() {
        let built = build_answer(
            "Alpha holds [doc-a#0]. Beta too [doc-b#3, doc-z#9]. Made up [doc-z#9].",
            &["doc-a#0".into(), "doc-z#9".into()],
            &evidence(),
        );
        assert_eq!(built.text, "Alpha holds [1]. Beta too [2]. Made up.");
        assert_eq!(built.dropped, vec!["doc-z#9"]);
        let ids: Vec<&str> = built
            .citations
            .iter()
            .map(|c| c.chunk_id.as_str())
            .collect();
        assert_eq!(ids, vec!["doc-a#0", "doc-b#3"]);
        assert_eq!(built.citations[1].n, 2);
        assert_eq!(built.citations[1].span, (300, 304));
    }

    #[test]
    fn ids_with_stray_characters_around_them_are_still_cited() {
        let mut evidence = evidence();
        evidence.insert(chunk("doc-a", 12, "alpha twelve"));
        let built = build_answer(
            "Alpha [doc-a#12.].",
            &["doc-b#3]}".into(), "\"doc-a#0.".into(), "doc-a#1".into()],
            &evidence,
        );
        let ids: Vec<&str> = built
            .citations
            .iter()
            .map(|c| c.chunk_id.as_str())
            .collect();
        assert_eq!(ids, vec!["doc-a#12", "doc-b#3", "doc-a#0"]);
        // `doc-a#1` is no chunk of the run, and not a prefix match of `doc-a#12`.
        assert_eq!(built.dropped, vec!["doc-a#1"]);
    }

    #[test]
    fn numeric_markers_refer_to_the_citation_list() {
        let built = build_answer(
            "Beta [2]. Alpha [1]. Nothing [3].",
            &["doc-a#0".into(), "doc-b#3".into()],
            &evidence(),
        );
        assert_eq!(built.text, "Beta [1]. Alpha [2]. Nothing.");
        assert_eq!(built.citations[0].chunk_id, "doc-b#3");
        assert!(built.dropped.is_empty());
    }

    #[test]
    fn unmarked_citations_are_appended_and_links_are_left_alone() {
        let built = build_answer(
            "See [the docs](http://x) and 【doc-b#3】.",
            &["chunk_id: doc-a#0".into(), "doc-b#3".into()],
            &evidence(),
        );
        assert_eq!(built.text, "See [the docs](http://x) and [1]. [2]");
        assert_eq!(built.citations.len(), 2);
        assert_eq!(built.citations[1].chunk_id, "doc-a#0");
    }

    #[test]
    fn nothing_citable_means_no_citations() {
        let built = build_answer(
            "I could not find it [x#1].",
            &["x#1".into()],
            &Evidence::default(),
        );
        assert_eq!(built.text, "I could not find it.");
        assert!(built.citations.is_empty());
        assert_eq!(built.dropped, vec!["x#1"]);
    }

    #[test]
    fn a_cited_document_stands_for_its_best_chunk() {
        let mut evidence = evidence();
        let mut better = chunk("doc-b", 4, "beta better");
        better.relevance = 0.9;
        evidence.insert(better);
        let built = build_answer("Beta [doc-b].", &["doc-b".into()], &evidence);
        assert_eq!(built.text, "Beta [1].");
        assert_eq!(built.citations.len(), 1);
        assert_eq!(built.citations[0].chunk_id, "doc-b#4");
        assert!(built.dropped.is_empty());
    }

    #[test]
    fn mentioned_ids_in_order_of_appearance() {
        let ids = mentioned_ids("first doc-b#3 then doc-a#0", &evidence());
        assert_eq!(ids, vec!["doc-b#3", "doc-a#0"]);
    }
}
