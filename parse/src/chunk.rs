//! Structure-aware chunking with sizes in cl100k tokens.
//!
//! [`chunk_document`] cuts a document into small *children* (what gets embedded and
//! searched) grouped into larger *parents* (what is handed to the model as context).
//!
//! 1. Markdown is parsed into blocks: headings (tracked as a heading path, `["Part",
//!    "Section"]`), fenced code, tables, lists and paragraphs. Plain text is paragraphs only.
//!    Every heading starts a section; a heading with nothing under it but another heading is
//!    carried into the next section instead of becoming a chunk of its own.
//! 2. Fenced code blocks and tables are *atomic*: never split, never used as overlap. An atomic
//!    block larger than the chunk budget becomes a chunk of its own that exceeds the budget
//!    (with its section's headings in front when it opens the section, and a small section
//!    tail merged behind when it closes it). Such a chunk is the only one that may exceed
//!    `chunk_tokens + min_tail_tokens + overlap_tokens` (besides a heading path so long that
//!    its prefix takes more than half of `chunk_tokens`: the body budget never drops below
//!    `chunk_tokens / 2`).
//! 3. Blocks of one section are packed greedily up to the budget (`chunk_tokens` less the
//!    tokens of the `[Context: ...]` prefix). A larger block (a heading line included) is split
//!    paragraph -> line -> sentence -> clause -> whitespace -> token, and its pieces are packed
//!    the same way.
//! 4. A section's last chunk smaller than `min_tail_tokens` merges into its predecessor.
//! 5. Each chunk after the first of a section starts with up to `overlap_tokens` of the
//!    previous chunk's tail, cut at a sentence (else clause, else word, else token) boundary.
//!    [`ChildDraft::span`] covers the chunk's own new text only, so the spans of consecutive
//!    children are increasing, do not overlap, and only whitespace lies between them.
//! 6. Children are grouped into parents of up to `parent_tokens`. A parent never splits a
//!    section that it could hold whole, and starts at a section boundary otherwise; several
//!    small whole sections may share a parent, whose prefix is their common heading path.
//!
//! Each section is encoded once; the size of any run of pieces is then a lookup in the token
//! offsets (`TokenIndex`), never a re-encoding per added piece. A child is re-encoded once,
//! when assembled, so that [`ChildDraft::token_count`] is exact (not even that when the child
//! is its whole section, the common case for short documents).

use tiktoken_rs::CoreBPE;

use crate::parse::Page;

/// Sizes of the chunks, all in cl100k tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkerConfig {
    /// Target size of a child chunk, including its `[Context: ...]` prefix.
    pub chunk_tokens: usize,
    /// Upper bound of the previous chunk's tail repeated at the start of a child.
    pub overlap_tokens: usize,
    /// Upper bound of the children's own text grouped into one parent.
    pub parent_tokens: usize,
    /// A section's last chunk smaller than this merges into its predecessor.
    pub min_tail_tokens: usize,
}

impl Default for ChunkerConfig {
    fn default() -> Self {
        let chunk_tokens = 256;
        ChunkerConfig {
            chunk_tokens,
            overlap_tokens: 32,
            parent_tokens: 1024,
            min_tail_tokens: chunk_tokens / 4,
        }
    }
}

/// The chunks of one document, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunked {
    pub parents: Vec<ParentDraft>,
    pub children: Vec<ChildDraft>,
}

/// A run of consecutive children, handed to the model as context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentDraft {
    pub position: u32,
    /// The `[Context: ...]` prefix of the children's common heading path, then the input
    /// text from the first child's span start to the last child's span end.
    pub text: String,
    /// Char offsets `[start, end)` in the input text.
    pub span: (u32, u32),
    /// First and last page of its children ([`chunk_pages`]); `None` for text without pages.
    pub pages: Option<(u32, u32)>,
}

/// A chunk that gets embedded and searched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildDraft {
    pub position: u32,
    pub parent_position: u32,
    /// `"[Context: A > B]\n"` followed by `body` when the heading path is non-empty.
    pub text: String,
    /// Overlap (a tail of the previous child) followed by this child's own text; a verbatim
    /// slice of the input.
    pub body: String,
    pub heading_path: Vec<String>,
    /// Char (not byte) offsets `[start, end)` of this child's own text (`body` without the
    /// overlap) in the input.
    pub span: (u32, u32),
    /// cl100k tokens of `text`.
    pub token_count: usize,
    /// The page it lies on, as `(first, last)` ([`chunk_pages`]: a child never crosses a page
    /// boundary, so both are the same); `None` for text without pages.
    pub pages: Option<(u32, u32)>,
}

fn bpe() -> &'static CoreBPE {
    tiktoken_rs::cl100k_base_singleton()
}

/// The number of cl100k tokens of `text` (special tokens are counted as plain text).
pub fn count_tokens(text: &str) -> usize {
    bpe().encode_ordinary(text).len()
}

/// The text of cl100k token ids (the tokenizer of OpenAI's embedding models, in which clients
/// such as LangChain send embedding inputs), or the first id it does not know.
pub fn decode_tokens(ids: &[u32]) -> Result<String, u32> {
    let bytes = bpe().decode_bytes(ids).map_err(|error| error.token)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The largest char boundary at or before `index` (`str::floor_char_boundary` is newer than
/// our MSRV).
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The smallest char boundary at or after `index`.
fn ceil_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

fn token_byte_len(bpe: &CoreBPE, token: u32) -> usize {
    bpe.decode_bytes(&[token]).map_or(0, |bytes| bytes.len())
}

/// Where the tokens of one encoded range of the input start, so that the tokens of any
/// sub-range are counted by two binary searches instead of re-encoding it.
///
/// Counts agree with encoding the sub-range on its own except at its edges (the first
/// word's leading space, punctuation that BPE joins to a neighbour), a token or two at most.
struct TokenIndex {
    /// Absolute byte offset of every token's first byte, increasing.
    starts: Vec<usize>,
    end: usize,
}

impl TokenIndex {
    fn new(text: &str, start: usize, end: usize) -> TokenIndex {
        let bpe = bpe();
        let mut position = start;
        let starts = bpe
            .encode_ordinary(&text[start..end])
            .into_iter()
            .map(|token| {
                let token_start = position;
                position += token_byte_len(bpe, token);
                token_start
            })
            .collect();
        TokenIndex { starts, end }
    }

    /// How many tokens the whole encoded range has.
    fn total(&self) -> usize {
        self.starts.len()
    }

    /// Index of the token holding byte `position`.
    fn token_at(&self, position: usize) -> usize {
        self.starts
            .partition_point(|&start| start <= position)
            .saturating_sub(1)
    }

    /// Tokens overlapping `[start, end)`.
    fn count(&self, start: usize, end: usize) -> usize {
        if start >= end {
            return 0;
        }
        self.starts.partition_point(|&token| token < end) - self.token_at(start)
    }

    /// Byte offset of token `index`, or the end of the range.
    fn offset(&self, index: usize) -> usize {
        self.starts.get(index).copied().unwrap_or(self.end)
    }
}

/// `[Context: A > B]\n`, or nothing for an empty heading path.
fn context_prefix(path: &[String]) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("[Context: {}]\n", path.join(" > "))
    }
}

/// Cuts `text` into children and parents. `markdown` turns on structure awareness.
pub fn chunk_document(text: &str, markdown: bool, config: &ChunkerConfig) -> Chunked {
    let sections = if markdown {
        markdown_sections(text)
    } else {
        plain_sections(text)
    };
    chunk_sections(text, &sections, config)
}

/// Cuts a run of Markdown that lies under `heading_path` into children and parents: a part of
/// a document read a run at a time (a spreadsheet's rows under their sheet's name). Its
/// sections' heading paths start with `heading_path`; positions and spans are the run's own,
/// for the caller to shift.
pub fn chunk_run(text: &str, heading_path: &[String], config: &ChunkerConfig) -> Chunked {
    let mut sections = markdown_sections(text);
    if !heading_path.is_empty() {
        for section in &mut sections {
            let mut path = heading_path.to_vec();
            path.append(&mut section.path);
            section.path = path;
        }
    }
    chunk_sections(text, &sections, config)
}

/// Cuts the plain text of a paged document (a PDF) into children and parents: each page is a
/// section of its own, under the page's heading path, so that no child (and no overlap)
/// crosses a page boundary and every chunk knows its pages. A parent may hold several whole
/// pages. A paragraph made only of Markdown table rows (a PDF table, as the parser renders
/// it) is a table: kept whole, as in Markdown. Pages whose range is not a char-boundary range
/// of `text` are skipped.
pub fn chunk_pages(text: &str, pages: &[Page], config: &ChunkerConfig) -> Chunked {
    let sections: Vec<Section> = pages
        .iter()
        .filter(|page| page.start <= page.end && text.get(page.start..page.end).is_some())
        .filter_map(|page| {
            let blocks: Vec<Block> = segments(text, page.start, page.end, SplitLevel::Paragraph)
                .into_iter()
                .map(|(start, end)| {
                    let mut lines = text[start..end].lines();
                    let table = lines.clone().nth(1).is_some() && lines.all(is_table_line);
                    Block {
                        start,
                        end,
                        kind: if table {
                            BlockKind::Table
                        } else {
                            BlockKind::Paragraph
                        },
                    }
                })
                .collect();
            (!blocks.is_empty()).then(|| Section {
                path: page.heading_path.clone(),
                blocks,
                page: Some(page.number),
            })
        })
        .collect();
    chunk_sections(text, &sections, config)
}

/// Cuts a Markdown document whose pages are known (a PowerPoint deck: a page a slide) into
/// children and parents with Markdown's structure awareness (headings, tables, lists, code),
/// each section split where a page starts, so that no child crosses a page and every chunk
/// knows its pages, as [`chunk_pages`] does for plain text. A block belongs to the page its
/// first byte is on; text outside every page has no page.
pub fn chunk_markdown_pages(text: &str, pages: &[Page], config: &ChunkerConfig) -> Chunked {
    let page_at = |offset: usize| {
        pages
            .iter()
            .find(|page| page.start <= offset && offset < page.end)
            .map(|page| page.number)
    };
    let mut sections: Vec<Section> = Vec::new();
    for section in markdown_sections(text) {
        let mut current: Option<Section> = None;
        for block in section.blocks {
            let page = page_at(block.start);
            match current.as_mut() {
                Some(open) if open.page == page => open.blocks.push(block),
                _ => {
                    sections.extend(current.take());
                    current = Some(Section {
                        path: section.path.clone(),
                        blocks: vec![block],
                        page,
                    });
                }
            }
        }
        sections.extend(current);
    }
    chunk_sections(text, &sections, config)
}

/// Packs the blocks of `sections` (in text order, non-empty) into children and parents.
fn chunk_sections(text: &str, sections: &[Section], config: &ChunkerConfig) -> Chunked {
    let bound = config.chunk_tokens + config.min_tail_tokens + config.overlap_tokens;
    let mut children = Vec::new();
    let mut placed = Vec::new();
    for (section_index, section) in sections.iter().enumerate() {
        let prefix = context_prefix(&section.path);
        let prefix_tokens = count_tokens(&prefix);
        let budget = config
            .chunk_tokens
            .saturating_sub(prefix_tokens)
            .max(config.chunk_tokens / 2)
            .max(1);
        let section_start = section.blocks[0].start;
        let section_end = section.blocks[section.blocks.len() - 1].end;
        let tokens = TokenIndex::new(text, section_start, section_end);
        let pieces = section_pieces(text, &tokens, &section.blocks, budget);
        let cores = pack(&tokens, &pieces, budget, config.min_tail_tokens);
        // The prefix ends in "]\n" and the body starts with a non-space: their tokens add up.
        let exact_count = |start: usize, end: usize| {
            if (start, end) == (section_start, section_end) {
                prefix_tokens + tokens.total()
            } else {
                prefix_tokens + count_tokens(&text[start..end])
            }
        };
        for (index, core) in cores.iter().enumerate() {
            let mut body_start = match index {
                0 => core.start,
                _ => overlap_start(
                    text,
                    &tokens,
                    &cores[index - 1],
                    core,
                    config.overlap_tokens,
                ),
            };
            let mut token_count = exact_count(body_start, core.end);
            if token_count > bound && body_start < core.start {
                // Encoded on its own, the chunk came out a few tokens larger than counted in
                // place: drop the overlap rather than break the bound.
                body_start = core.start;
                token_count = exact_count(body_start, core.end);
            }
            let child_text = format!("{prefix}{}", &text[body_start..core.end]);
            placed.push(PlacedChild {
                section: section_index,
                start: core.start,
                end: core.end,
                tokens: core.tokens,
            });
            children.push(ChildDraft {
                position: 0,
                parent_position: 0,
                text: child_text,
                body: text[body_start..core.end].to_string(),
                heading_path: section.path.clone(),
                span: (0, 0),
                token_count,
                pages: section.page.map(|page| (page, page)),
            });
        }
    }

    let mut chars = CharOffsets::new(text);
    for (position, (child, place)) in children.iter_mut().zip(&placed).enumerate() {
        child.position = position as u32;
        child.span = (chars.at(place.start), chars.at(place.end));
    }

    let mut parents = Vec::new();
    let mut chars = CharOffsets::new(text);
    for (position, group) in group_parents(&placed, config.parent_tokens)
        .into_iter()
        .enumerate()
    {
        let (first, last) = (&placed[group.start], &placed[group.end - 1]);
        let mut path: &[String] = &sections[first.section].path;
        for child in &placed[group.clone()] {
            let other = &sections[child.section].path;
            let common = path.iter().zip(other).take_while(|(a, b)| a == b).count();
            path = &path[..common];
        }
        for child in &mut children[group] {
            child.parent_position = position as u32;
        }
        parents.push(ParentDraft {
            position: position as u32,
            text: format!("{}{}", context_prefix(path), &text[first.start..last.end]),
            span: (chars.at(first.start), chars.at(last.end)),
            pages: sections[first.section]
                .page
                .zip(sections[last.section].page),
        });
    }
    Chunked { parents, children }
}

/// A child's own text (byte offsets) and section, for grouping into parents.
struct PlacedChild {
    section: usize,
    start: usize,
    end: usize,
    tokens: usize,
}

/// Ranges of children per parent. A section that fits the room left in the current parent
/// joins it whole; otherwise it starts a fresh parent and, if larger than `parent_tokens`,
/// is split by size into parents of its own.
fn group_parents(children: &[PlacedChild], parent_tokens: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut group_start = 0;
    let mut group_tokens = 0;
    let mut index = 0;
    while index < children.len() {
        let section = children[index].section;
        let section_end = children[index..]
            .iter()
            .position(|child| child.section != section)
            .map_or(children.len(), |offset| index + offset);
        let section_tokens: usize = children[index..section_end]
            .iter()
            .map(|child| child.tokens)
            .sum();
        if index > group_start && group_tokens + section_tokens > parent_tokens {
            groups.push(group_start..index);
            group_start = index;
            group_tokens = 0;
        }
        let mut split = false;
        for (child, placed) in children.iter().enumerate().take(section_end).skip(index) {
            let tokens = placed.tokens;
            if child > group_start && group_tokens + tokens > parent_tokens {
                groups.push(group_start..child);
                group_start = child;
                group_tokens = 0;
                split = true;
            }
            group_tokens += tokens;
        }
        if split {
            // The tail of a split section is not topped up with the next section.
            groups.push(group_start..section_end);
            group_start = section_end;
            group_tokens = 0;
        }
        index = section_end;
    }
    if group_start < children.len() {
        groups.push(group_start..children.len());
    }
    groups
}

/// Converts byte offsets to char offsets, cheaply for non-decreasing queries.
struct CharOffsets<'a> {
    text: &'a str,
    byte: usize,
    chars: usize,
}

impl<'a> CharOffsets<'a> {
    fn new(text: &'a str) -> Self {
        CharOffsets {
            text,
            byte: 0,
            chars: 0,
        }
    }

    fn at(&mut self, byte: usize) -> u32 {
        if byte < self.byte {
            self.byte = 0;
            self.chars = 0;
        }
        self.chars += self.text[self.byte..byte].chars().count();
        self.byte = byte;
        self.chars as u32
    }
}

// ---------------------------------------------------------------------------------------
// Blocks and sections
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Heading,
    Code,
    Table,
    List,
    Paragraph,
}

impl BlockKind {
    fn is_atomic(self) -> bool {
        matches!(self, BlockKind::Code | BlockKind::Table)
    }
}

/// A trimmed, non-empty byte range of the input.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: usize,
    end: usize,
    kind: BlockKind,
}

#[derive(Debug, Default)]
struct Section {
    path: Vec<String>,
    blocks: Vec<Block>,
    /// The page the section is on ([`chunk_pages`], [`chunk_markdown_pages`]).
    page: Option<u32>,
}

/// `(start, end)` of every line, `end` excluding the newline.
fn line_ranges(text: &str) -> Vec<(usize, usize)> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (index, byte) in text.bytes().enumerate() {
        if byte == b'\n' {
            lines.push((start, index));
            start = index + 1;
        }
    }
    if start < text.len() {
        lines.push((start, text.len()));
    }
    lines
}

/// Shrinks `[start, end)` to exclude surrounding whitespace; `None` when nothing is left.
fn trimmed(text: &str, start: usize, end: usize) -> Option<(usize, usize)> {
    let slice = &text[start..end];
    let without_leading = slice.trim_start();
    let new_start = start + (slice.len() - without_leading.len());
    let new_end = new_start + without_leading.trim_end().len();
    (new_start < new_end).then_some((new_start, new_end))
}

fn plain_sections(text: &str) -> Vec<Section> {
    let blocks: Vec<Block> = segments(text, 0, text.len(), SplitLevel::Paragraph)
        .into_iter()
        .map(|(start, end)| Block {
            start,
            end,
            kind: BlockKind::Paragraph,
        })
        .collect();
    if blocks.is_empty() {
        return Vec::new();
    }
    vec![Section {
        path: Vec::new(),
        blocks,
        page: None,
    }]
}

/// An ATX heading: level and text without the `#`s.
fn heading(line: &str) -> Option<(usize, String)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let level = rest.bytes().take_while(|&byte| byte == b'#').count();
    if level == 0 || level > 6 {
        return None;
    }
    let after = &rest[level..];
    if !after.is_empty() && !after.starts_with([' ', '\t']) {
        return None;
    }
    let mut title = after.trim();
    let without_closing = title.trim_end_matches('#');
    if without_closing.is_empty() || without_closing.ends_with([' ', '\t']) {
        title = without_closing.trim_end();
    }
    (!title.is_empty()).then(|| (level, title.to_string()))
}

/// An opening code fence: its character and length.
fn fence_open(line: &str) -> Option<(u8, usize)> {
    let trimmed = line.trim_start();
    let marker = *trimmed.as_bytes().first()?;
    if marker != b'`' && marker != b'~' {
        return None;
    }
    let length = trimmed.bytes().take_while(|&byte| byte == marker).count();
    if length < 3 || (marker == b'`' && trimmed[length..].contains('`')) {
        return None;
    }
    Some((marker, length))
}

fn fence_closes(line: &str, marker: u8, length: usize) -> bool {
    let trimmed = line.trim();
    trimmed.len() >= length && trimmed.bytes().all(|byte| byte == marker)
}

fn is_table_line(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

fn is_bullet_item(line: &str) -> bool {
    let trimmed = line.trim_start();
    ["- ", "* ", "+ "]
        .iter()
        .any(|marker| trimmed.starts_with(marker))
        || matches!(trimmed, "-" | "*" | "+")
}

fn is_list_item(line: &str) -> bool {
    if is_bullet_item(line) {
        return true;
    }
    let trimmed = line.trim_start();
    let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
    (1..=9).contains(&digits)
        && matches!(trimmed.as_bytes().get(digits), Some(b'.' | b')'))
        && matches!(
            trimmed.as_bytes().get(digits + 1),
            None | Some(b' ' | b'\t')
        )
}

fn markdown_sections(text: &str) -> Vec<Section> {
    let lines = line_ranges(text);
    let line = |index: usize| &text[lines[index].0..lines[index].1];
    let mut sections = vec![Section::default()];
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let current = line(index);
        if current.trim().is_empty() {
            index += 1;
            continue;
        }
        let first = index;
        let kind;
        if let Some((marker, length)) = fence_open(current) {
            kind = BlockKind::Code;
            index += 1;
            while index < lines.len() && !fence_closes(line(index), marker, length) {
                index += 1;
            }
            index = (index + 1).min(lines.len());
        } else if let Some((level, title)) = heading(current) {
            index += 1;
            while stack.last().is_some_and(|(open, _)| *open >= level) {
                stack.pop();
            }
            stack.push((level, title));
            let path = stack.iter().map(|(_, title)| title.clone()).collect();
            let section = sections.last_mut().expect("there is always a section");
            if section
                .blocks
                .iter()
                .all(|block| block.kind == BlockKind::Heading)
            {
                // Nothing under the previous heading yet: carry it into this section.
                section.path = path;
            } else {
                sections.push(Section {
                    path,
                    blocks: Vec::new(),
                    page: None,
                });
            }
            kind = BlockKind::Heading;
        } else if is_table_line(current) {
            kind = BlockKind::Table;
            while index < lines.len() && is_table_line(line(index)) {
                index += 1;
            }
        } else {
            let list = is_list_item(current);
            kind = if list {
                BlockKind::List
            } else {
                BlockKind::Paragraph
            };
            index += 1;
            while index < lines.len() {
                let next = line(index);
                let interrupts = next.trim().is_empty()
                    || fence_open(next).is_some()
                    || heading(next).is_some()
                    || is_table_line(next)
                    || (!list && is_bullet_item(next));
                if interrupts {
                    break;
                }
                index += 1;
            }
        }
        let end = lines[index - 1].1;
        if let Some((start, end)) = trimmed(text, lines[first].0, end) {
            let section = sections.last_mut().expect("there is always a section");
            section.blocks.push(Block { start, end, kind });
        }
    }
    sections.retain(|section| !section.blocks.is_empty());
    sections
}

// ---------------------------------------------------------------------------------------
// Splitting
// ---------------------------------------------------------------------------------------

/// Boundaries tried in order when a block is too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SplitLevel {
    Paragraph,
    Line,
    Sentence,
    Clause,
    Whitespace,
    Token,
}

impl SplitLevel {
    fn next(self) -> SplitLevel {
        match self {
            SplitLevel::Paragraph => SplitLevel::Line,
            SplitLevel::Line => SplitLevel::Sentence,
            SplitLevel::Sentence => SplitLevel::Clause,
            SplitLevel::Clause => SplitLevel::Whitespace,
            SplitLevel::Whitespace | SplitLevel::Token => SplitLevel::Token,
        }
    }
}

/// Closing quotes and brackets that stay with the sentence they end.
fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | ')' | ']' | '”' | '’' | '」' | '』' | '）' | '】' | '》' | '〉'
    )
}

/// Byte positions strictly inside `(start, end)` right after a boundary of `level`.
/// [`SplitLevel::Token`] has no textual boundaries.
fn boundaries(text: &str, start: usize, end: usize, level: SplitLevel) -> Vec<usize> {
    let slice = &text[start..end];
    let mut found = Vec::new();
    let mut chars = slice.char_indices().peekable();
    while let Some((offset, c)) = chars.next() {
        let after = offset + c.len_utf8();
        let position = match level {
            SplitLevel::Paragraph => {
                if c != '\n' {
                    continue;
                }
                let rest = &slice[after..];
                let blank = rest.trim_start_matches([' ', '\t', '\r']);
                if !blank.starts_with('\n') {
                    continue;
                }
                after + (rest.len() - blank.len()) + 1
            }
            SplitLevel::Line => {
                if c != '\n' {
                    continue;
                }
                after
            }
            SplitLevel::Sentence | SplitLevel::Clause => {
                let (latin, wide): (&[char], &[char]) = if level == SplitLevel::Sentence {
                    (&['.', '!', '?'], &['。', '！', '？', '；', '…'])
                } else {
                    (&[',', ';', ':'], &['，', '、', '：', '；'])
                };
                if !latin.contains(&c) && !wide.contains(&c) {
                    continue;
                }
                let mut position = after;
                while let Some(&(next_offset, next)) = chars.peek() {
                    if !is_closer(next) {
                        break;
                    }
                    position = next_offset + next.len_utf8();
                    chars.next();
                }
                let followed_by_space = slice[position..]
                    .chars()
                    .next()
                    .is_none_or(char::is_whitespace);
                if latin.contains(&c) && !followed_by_space {
                    continue;
                }
                position
            }
            SplitLevel::Whitespace => {
                if !c.is_whitespace() {
                    continue;
                }
                match chars.peek() {
                    Some(&(next_offset, next)) if !next.is_whitespace() => next_offset,
                    _ => continue,
                }
            }
            SplitLevel::Token => return found,
        };
        if position > 0 && position < slice.len() {
            found.push(start + position);
        }
    }
    found
}

/// The trimmed, non-empty ranges between boundaries of `level` in `[start, end)`.
fn segments(text: &str, start: usize, end: usize, level: SplitLevel) -> Vec<(usize, usize)> {
    let mut cuts = vec![start];
    cuts.extend(boundaries(text, start, end, level));
    cuts.push(end);
    cuts.windows(2)
        .filter_map(|pair| trimmed(text, pair[0], pair[1]))
        .collect()
}

/// A contiguous, trimmed range of one block (or a whole block) with its token count.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: usize,
    end: usize,
    tokens: usize,
    atomic: bool,
    heading: bool,
}

impl Piece {
    fn new(tokens: &TokenIndex, start: usize, end: usize, kind: BlockKind) -> Piece {
        Piece {
            start,
            end,
            tokens: tokens.count(start, end),
            atomic: kind.is_atomic(),
            heading: kind == BlockKind::Heading,
        }
    }
}

/// The pieces of a section, each at most `budget` tokens unless atomic.
fn section_pieces(text: &str, tokens: &TokenIndex, blocks: &[Block], budget: usize) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    for block in blocks {
        let piece = Piece::new(tokens, block.start, block.end, block.kind);
        let mut block_pieces = Vec::new();
        // A heading longer than the budget (a paragraph behind a `#`) is split like one.
        if piece.atomic || piece.tokens <= budget {
            block_pieces.push(piece);
        } else {
            split_range(
                text,
                tokens,
                block.start,
                block.end,
                budget,
                SplitLevel::Paragraph,
                &mut block_pieces,
            );
        }
        // Keep the section's headings with the start of its first content block: if they
        // would not fit together, split that start finer.
        let heading_tokens: usize = pieces.iter().map(|piece| piece.tokens + 1).sum();
        let all_headings = !pieces.is_empty() && pieces.iter().all(|piece| piece.heading);
        if let Some(first) = block_pieces.first().copied()
            && all_headings
            && !first.atomic
            && !first.heading
            && heading_tokens + first.tokens + 1 > budget
            && budget > heading_tokens + 16
        {
            let mut finer = Vec::new();
            let room = budget - heading_tokens - 1;
            split_range(
                text,
                tokens,
                first.start,
                first.end,
                room,
                SplitLevel::Paragraph,
                &mut finer,
            );
            block_pieces.splice(0..1, finer);
        }
        pieces.extend(block_pieces);
    }
    pieces
}

/// Splits `[start, end)` at the coarsest boundaries that yield pieces of at most `budget`.
fn split_range(
    text: &str,
    tokens: &TokenIndex,
    start: usize,
    end: usize,
    budget: usize,
    level: SplitLevel,
    out: &mut Vec<Piece>,
) {
    if level == SplitLevel::Token {
        hard_split(text, tokens, start, end, budget, out);
        return;
    }
    let parts = segments(text, start, end, level);
    if parts.len() <= 1 {
        split_range(text, tokens, start, end, budget, level.next(), out);
        return;
    }
    for (part_start, part_end) in parts {
        let piece = Piece::new(tokens, part_start, part_end, BlockKind::Paragraph);
        if piece.tokens <= budget {
            out.push(piece);
        } else {
            split_range(
                text,
                tokens,
                part_start,
                part_end,
                budget,
                level.next(),
                out,
            );
        }
    }
}

/// Cuts `[start, end)` every `budget` tokens (a little less, for the edges), at char
/// boundaries.
fn hard_split(
    text: &str,
    tokens: &TokenIndex,
    start: usize,
    end: usize,
    budget: usize,
    out: &mut Vec<Piece>,
) {
    let limit = budget.saturating_sub(2).max(1);
    let mut piece_start = start;
    while piece_start < end {
        let target = tokens.offset(tokens.token_at(piece_start) + limit);
        let mut cut = floor_char_boundary(text, target.min(end));
        if cut <= piece_start {
            cut = ceil_char_boundary(text, piece_start + 1).min(end);
        }
        if let Some((from, to)) = trimmed(text, piece_start, cut) {
            out.push(Piece::new(tokens, from, to, BlockKind::Paragraph));
        }
        piece_start = cut;
    }
}

// ---------------------------------------------------------------------------------------
// Packing and overlap
// ---------------------------------------------------------------------------------------

/// A child's own text before overlap is added.
#[derive(Debug, Clone, Copy)]
struct Core {
    start: usize,
    end: usize,
    tokens: usize,
    starts_atomic: bool,
    ends_atomic: bool,
    /// End of the last atomic piece inside, if any: overlap never reaches before it.
    atomic_end: Option<usize>,
    /// Holds an atomic piece larger than the budget (so it may be as large as it needs).
    oversize: bool,
}

impl Core {
    fn of(pieces: &[Piece], tokens: usize, budget: usize) -> Core {
        let first = pieces.first().expect("a core has pieces");
        let last = pieces.last().expect("a core has pieces");
        Core {
            start: first.start,
            end: last.end,
            tokens,
            starts_atomic: first.atomic,
            ends_atomic: last.atomic,
            atomic_end: pieces
                .iter()
                .rev()
                .find(|piece| piece.atomic)
                .map(|piece| piece.end),
            oversize: pieces
                .iter()
                .any(|piece| piece.atomic && piece.tokens > budget),
        }
    }
}

/// Greedy packing of one section's pieces, then the small-tail merge.
fn pack(tokens: &TokenIndex, pieces: &[Piece], budget: usize, min_tail_tokens: usize) -> Vec<Core> {
    let mut cores: Vec<Core> = Vec::new();
    let mut first = 0;
    while first < pieces.len() {
        let mut end = first + 1;
        let mut size = pieces[first].tokens;
        let mut glued = false;
        while end < pieces.len() {
            let next = &pieces[end];
            // The joined size (with separators) is a lookup, no re-encoding per piece.
            let joined = tokens.count(pieces[first].start, next.end);
            if joined <= budget {
                size = joined;
                end += 1;
            } else if next.atomic && pieces[first..end].iter().all(|piece| piece.heading) {
                // A heading never ends up alone in front of its code block or table.
                end += 1;
                glued = true;
                break;
            } else {
                break;
            }
        }
        if glued {
            size = tokens.count(pieces[first].start, pieces[end - 1].end);
        }
        let mut core = Core::of(&pieces[first..end], size, budget);
        core.oversize |= glued;
        cores.push(core);
        first = end;
    }
    if let [.., previous, last] = cores[..]
        && last.tokens < min_tail_tokens
    {
        let merged = tokens.count(previous.start, last.end);
        if merged <= budget + min_tail_tokens || previous.oversize || last.oversize {
            cores.pop();
            *cores.last_mut().expect("two cores") = Core {
                start: previous.start,
                end: last.end,
                tokens: merged,
                starts_atomic: previous.starts_atomic,
                ends_atomic: last.ends_atomic,
                atomic_end: last.atomic_end.or(previous.atomic_end),
                oversize: previous.oversize || last.oversize,
            };
        }
    }
    cores
}

/// Where `current`'s body starts: inside `previous`'s tail (at most `overlap_tokens`, cut at
/// the earliest sentence, clause or word boundary of that window) or at its own start.
fn overlap_start(
    text: &str,
    tokens: &TokenIndex,
    previous: &Core,
    current: &Core,
    overlap_tokens: usize,
) -> usize {
    if overlap_tokens == 0 || previous.ends_atomic || current.starts_atomic {
        return current.start;
    }
    let lower = previous
        .atomic_end
        .map_or(previous.start, |end| end.max(previous.start));
    let end = previous.end;
    let window = if tokens.count(lower, end) <= overlap_tokens {
        lower
    } else {
        // The first of the last `overlap_tokens` tokens before `end`.
        let last = tokens.token_at(end - 1);
        ceil_char_boundary(text, tokens.offset(last + 1 - overlap_tokens)).max(lower)
    };
    let start = if window == lower {
        window
    } else {
        let sentence = [
            SplitLevel::Paragraph,
            SplitLevel::Line,
            SplitLevel::Sentence,
        ]
        .into_iter()
        .filter_map(|level| boundaries(text, window, end, level).first().copied())
        .min();
        sentence
            .or_else(|| {
                boundaries(text, window, end, SplitLevel::Clause)
                    .first()
                    .copied()
            })
            .or_else(|| {
                boundaries(text, window, end, SplitLevel::Whitespace)
                    .first()
                    .copied()
            })
            .unwrap_or(window)
    };
    match trimmed(text, start, end) {
        Some((start, _)) => start,
        None => current.start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(chunk_tokens: usize, overlap_tokens: usize, parent_tokens: usize) -> ChunkerConfig {
        ChunkerConfig {
            chunk_tokens,
            overlap_tokens,
            parent_tokens,
            min_tail_tokens: chunk_tokens / 4,
        }
    }

    fn char_slice(text: &str, (start, end): (u32, u32)) -> String {
        text.chars()
            .skip(start as usize)
            .take((end - start) as usize)
            .collect()
    }

    /// A paged text: `pages` of `paragraphs` paragraphs each, pages under alternating
    /// headings, and the page ranges.
    fn paged(pages: u32, paragraphs: usize) -> (String, Vec<Page>) {
        let mut text = String::new();
        let mut ranges = Vec::new();
        for number in 1..=pages {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            let start = text.len();
            for paragraph in 0..paragraphs {
                if paragraph > 0 {
                    text.push_str("\n\n");
                }
                text.push_str(&format!(
                    "Page {number} paragraph {paragraph} tells of harbour lights. The keeper \
                     trims the wick, winds the clockwork and logs the weather at dusk."
                ));
            }
            ranges.push(Page {
                number,
                start,
                end: text.len(),
                heading_path: vec![format!("Part {}", number.div_ceil(2))],
            });
        }
        (text, ranges)
    }

    #[test]
    fn paged_chunks_never_cross_a_page_and_carry_it() {
        let (text, pages) = paged(4, 6);
        let chunked = chunk_pages(&text, &pages, &config(64, 16, 200));
        assert!(chunked.children.len() > 8, "{}", chunked.children.len());
        for child in &chunked.children {
            let (first, last) = child.pages.expect("a paged child has pages");
            assert_eq!(first, last);
            let page = &pages[first as usize - 1];
            // Its own text and its overlap both lie on its page (the body is a verbatim slice).
            assert!(
                text[page.start..page.end].contains(&child.body),
                "{:?} on page {first}",
                child.body
            );
            assert_eq!(child.heading_path, page.heading_path);
            assert!(
                child
                    .text
                    .starts_with(&format!("[Context: Part {}]\n", first.div_ceil(2)))
            );
        }
        let pages_of_children: Vec<u32> = chunked
            .children
            .iter()
            .map(|child| child.pages.unwrap().0)
            .collect();
        assert!(pages_of_children.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(pages_of_children.first(), Some(&1));
        assert_eq!(pages_of_children.last(), Some(&4));
        for parent in &chunked.parents {
            let (first, last) = parent.pages.expect("a paged parent has pages");
            let children: Vec<&ChildDraft> = chunked
                .children
                .iter()
                .filter(|child| child.parent_position == parent.position)
                .collect();
            assert_eq!(children.first().unwrap().pages.unwrap().0, first);
            assert_eq!(children.last().unwrap().pages.unwrap().1, last);
        }
    }

    #[test]
    fn short_pages_are_chunks_of_their_own_and_share_a_parent() {
        let (text, pages) = paged(3, 1);
        let chunked = chunk_pages(&text, &pages, &ChunkerConfig::default());
        let pages_of: Vec<Option<(u32, u32)>> =
            chunked.children.iter().map(|child| child.pages).collect();
        assert_eq!(pages_of, [Some((1, 1)), Some((2, 2)), Some((3, 3))]);
        assert_eq!(chunked.parents.len(), 1);
        assert_eq!(chunked.parents[0].pages, Some((1, 3)));
        // Text without pages has none.
        let plain = chunk_document(&text, false, &ChunkerConfig::default());
        assert!(plain.children.iter().all(|child| child.pages.is_none()));
        assert!(plain.parents.iter().all(|parent| parent.pages.is_none()));
    }

    #[test]
    fn pages_out_of_range_are_skipped() {
        let text = "héllo world";
        let pages = [
            Page {
                number: 1,
                start: 0,
                end: 2,
                heading_path: Vec::new(),
            }, // inside 'é'
            Page {
                number: 2,
                start: 7,
                end: 99,
                heading_path: Vec::new(),
            },
            Page {
                number: 3,
                start: 7,
                end: 3,
                heading_path: Vec::new(),
            },
            Page {
                number: 4,
                start: 7,
                end: text.len(),
                heading_path: Vec::new(),
            },
        ];
        let chunked = chunk_pages(text, &pages, &ChunkerConfig::default());
        assert_eq!(chunked.children.len(), 1);
        assert_eq!(chunked.children[0].body, "world");
        assert_eq!(chunked.children[0].pages, Some((4, 4)));
    }

    /// The overlap part of a child's body: what precedes its own text.
    fn overlap_of(text: &str, child: &ChildDraft) -> String {
        let own = char_slice(text, child.span);
        assert!(
            child.body.ends_with(&own),
            "body must end with its own text"
        );
        child.body[..child.body.len() - own.len()].to_string()
    }

    /// Structural invariants that hold for every output.
    fn check_invariants(text: &str, chunked: &Chunked) {
        let mut previous_end = 0;
        for (index, child) in chunked.children.iter().enumerate() {
            assert_eq!(child.position as usize, index);
            assert!(child.span.0 < child.span.1, "empty child {child:?}");
            assert!(
                child.span.0 >= previous_end,
                "spans out of order at {index}"
            );
            let between = char_slice(text, (previous_end, child.span.0));
            assert!(between.trim().is_empty(), "uncovered text {between:?}");
            previous_end = child.span.1;
            let prefix = context_prefix(&child.heading_path);
            assert_eq!(child.text, format!("{prefix}{}", child.body));
            assert_eq!(child.token_count, count_tokens(&child.text));
            assert!(!child.body.trim().is_empty());
            overlap_of(text, child);
            let body_chars = child.body.chars().count() as u32;
            assert_eq!(
                char_slice(text, (child.span.1 - body_chars, child.span.1)),
                child.body
            );
        }
        assert!(
            char_slice(text, (previous_end, text.chars().count() as u32))
                .trim()
                .is_empty()
        );
        let mut previous_parent_end = 0;
        for (index, parent) in chunked.parents.iter().enumerate() {
            assert_eq!(parent.position as usize, index);
            assert!(parent.span.0 >= previous_parent_end);
            previous_parent_end = parent.span.1;
            assert!(parent.text.ends_with(&char_slice(text, parent.span)));
            let children: Vec<_> = chunked
                .children
                .iter()
                .filter(|child| child.parent_position == parent.position)
                .collect();
            assert!(!children.is_empty(), "parent {index} has no children");
            assert_eq!(parent.span.0, children[0].span.0);
            assert_eq!(parent.span.1, children.last().unwrap().span.1);
            for child in children {
                assert!(parent.span.0 <= child.span.0 && child.span.1 <= parent.span.1);
            }
        }
        for child in &chunked.children {
            assert!((child.parent_position as usize) < chunked.parents.len());
        }
    }

    fn sentences(count: usize) -> String {
        (0..count)
            .map(|index| {
                format!("Sentence number {index} talks about replicated shards and search.")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn count_tokens_uses_cl100k() {
        assert_eq!(count_tokens("hello world"), 2);
        assert_eq!(count_tokens(""), 0);
        assert_eq!(
            count_tokens("<|endoftext|>"),
            bpe().encode_ordinary("<|endoftext|>").len()
        );
    }

    #[test]
    fn token_ids_decode_to_their_text_and_an_unknown_id_is_named() {
        let text = "Aspirin and heart attacks: 心脏病";
        let ids = bpe().encode_ordinary(text);
        assert_eq!(decode_tokens(&ids).as_deref(), Ok(text));
        assert_eq!(decode_tokens(&[]).as_deref(), Ok(""));
        assert_eq!(decode_tokens(&[ids[0], u32::MAX, 7]), Err(u32::MAX));
    }

    #[test]
    fn empty_input_has_no_chunks() {
        for text in ["", "  \n\n \t"] {
            let chunked = chunk_document(text, true, &ChunkerConfig::default());
            assert!(chunked.children.is_empty() && chunked.parents.is_empty());
        }
    }

    #[test]
    fn headings_become_context_prefixes() {
        let text = "Preamble text.\n\n# Part\n\nIntro of the part.\n\n## Section\n\nSection body.\n\n### Deep\n\nDeep body.\n\n## Other\n\nOther body.";
        let chunked = chunk_document(text, true, &ChunkerConfig::default());
        check_invariants(text, &chunked);
        let paths: Vec<Vec<&str>> = chunked
            .children
            .iter()
            .map(|child| child.heading_path.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            paths,
            vec![
                vec![],
                vec!["Part"],
                vec!["Part", "Section"],
                vec!["Part", "Section", "Deep"],
                vec!["Part", "Other"],
            ]
        );
        assert_eq!(chunked.children[0].text, "Preamble text.");
        assert_eq!(
            chunked.children[2].text,
            "[Context: Part > Section]\n## Section\n\nSection body."
        );
        assert_eq!(chunked.children[2].body, "## Section\n\nSection body.");
        assert_eq!(
            chunked.children[4].text,
            "[Context: Part > Other]\n## Other\n\nOther body."
        );
    }

    #[test]
    fn heading_without_content_is_carried_into_the_next_section() {
        let text = "# Part ##\n\n## Section\n\nBody.";
        let chunked = chunk_document(text, true, &ChunkerConfig::default());
        check_invariants(text, &chunked);
        assert_eq!(chunked.children.len(), 1);
        assert_eq!(chunked.children[0].heading_path, vec!["Part", "Section"]);
        assert_eq!(
            chunked.children[0].text,
            format!("[Context: Part > Section]\n{text}")
        );
    }

    #[test]
    fn plain_text_has_no_structure() {
        let text = "# not a heading\n\n```\nnot code\n```";
        let chunked = chunk_document(text, false, &ChunkerConfig::default());
        assert_eq!(chunked.children.len(), 1);
        assert!(chunked.children[0].heading_path.is_empty());
        assert_eq!(chunked.children[0].text, text);
    }

    #[test]
    fn large_code_fence_is_one_chunk() {
        let code: String = (0..400)
            .map(|index| format!("    let value_{index} = compute(value_{index} + 1);\n"))
            .collect();
        let fence = format!("```rust\n{code}```");
        assert!(count_tokens(&fence) > 2000);
        let text = format!(
            "# Code\n\n{fence}\n\n{}\n\n{fence}\n\nAfter.",
            sentences(40)
        );
        let config = ChunkerConfig::default();
        let chunked = chunk_document(&text, true, &config);
        check_invariants(&text, &chunked);
        let holders: Vec<_> = chunked
            .children
            .iter()
            .filter(|child| child.body.contains("value_200 "))
            .collect();
        assert_eq!(holders.len(), 2, "each fence lies in exactly one child");
        for holder in holders {
            assert!(holder.body.contains(&fence));
            assert!(holder.token_count > 2000);
            assert!(
                !holder.body.starts_with("Sentence"),
                "no overlap before a fence"
            );
        }
        // The heading stays with its fence rather than forming a chunk of its own.
        assert!(chunked.children[0].body.starts_with("# Code\n\n```rust"));
        // No overlap after a fence: the next child starts with its own text.
        let after_fence = &chunked.children[1];
        assert!(overlap_of(&text, after_fence).is_empty());
        assert!(after_fence.token_count <= config.chunk_tokens);
    }

    #[test]
    fn unclosed_fence_runs_to_the_end() {
        let text = format!("Intro.\n\n```\n# not a heading\n{}", sentences(80));
        let chunked = chunk_document(&text, true, &config(64, 8, 512));
        check_invariants(&text, &chunked);
        assert_eq!(chunked.children.len(), 2);
        assert_eq!(chunked.children[0].body, "Intro.");
        assert!(chunked.children[1].body.starts_with("```\n# not a heading"));
        assert!(chunked.children[1].body.ends_with("search."));
        assert!(
            chunked
                .children
                .iter()
                .all(|child| child.heading_path.is_empty())
        );
    }

    #[test]
    fn tables_are_never_split() {
        let rows: String = (0..120)
            .map(|row| format!("| row {row} | value {} | note about row {row} |\n", row * 7))
            .collect();
        let table = format!("| name | value | note |\n| --- | --- | --- |\n{rows}");
        let table = table.trim_end();
        let text = format!(
            "## Data\n\n{}\n\n{table}\n\n{}",
            sentences(10),
            sentences(10)
        );
        let chunked = chunk_document(&text, true, &config(128, 16, 1024));
        check_invariants(&text, &chunked);
        let holders: Vec<_> = chunked
            .children
            .iter()
            .filter(|child| child.body.contains("| row 60 |"))
            .collect();
        assert_eq!(holders.len(), 1);
        assert!(holders[0].body.contains(table));
        assert!(
            holders[0].body.starts_with("| name"),
            "no overlap into a table"
        );
    }

    #[test]
    fn cjk_text_splits_at_sentence_and_clause_punctuation() {
        let sentence = "检索增强生成系统会先把上传的文档切分成较小的片段，然后为每个片段计算向量。\
            当用户提出问题时，系统从向量库中找出最相关的片段！难道这不是很有用吗？";
        let text = sentence.repeat(20);
        let config = config(64, 16, 512);
        let chunked = chunk_document(&text, false, &config);
        check_invariants(&text, &chunked);
        assert!(chunked.children.len() > 5);
        for child in &chunked.children[..chunked.children.len() - 1] {
            let own = char_slice(&text, child.span);
            assert!(
                own.ends_with(['。', '！', '？', '，']),
                "cut mid-sentence: {own}"
            );
            assert!(child.token_count <= config.chunk_tokens + config.overlap_tokens);
        }
        for child in &chunked.children[1..] {
            let overlap = overlap_of(&text, child);
            assert!(!overlap.is_empty());
            assert!(
                count_tokens(&overlap) <= config.overlap_tokens + 1,
                "{overlap}"
            );
        }
    }

    #[test]
    fn text_without_any_boundary_is_split_by_tokens() {
        let text = "数据复制".repeat(300);
        let config = config(50, 10, 400);
        let chunked = chunk_document(&text, false, &config);
        check_invariants(&text, &chunked);
        assert!(chunked.children.len() > 10);
        let bound = config.chunk_tokens + config.min_tail_tokens + config.overlap_tokens;
        assert!(
            chunked
                .children
                .iter()
                .all(|child| child.token_count <= bound)
        );
    }

    /// Found by the `parse_markdown` fuzz target: a heading line longer than the budget, with
    /// nothing under it, carried into the next section, was one chunk of twice the bound.
    #[test]
    fn heading_longer_than_the_budget_is_split() {
        let long_heading = format!("#### {}", "ے.ےےےے #ےےےےےےے ".repeat(12));
        let text = format!(
            "# A\n## B\n\ntext\n\n{long_heading}\n# A\n{}\n",
            "ےےےے".repeat(20)
        );
        let config = config(28, 2, 44);
        let chunked = chunk_document(&text, true, &config);
        check_invariants(&text, &chunked);
        let bound = config.chunk_tokens + config.min_tail_tokens + config.overlap_tokens;
        for child in &chunked.children {
            assert!(
                child.token_count <= bound,
                "child of {} tokens exceeds {bound}: {:?}",
                child.token_count,
                child.text
            );
        }
    }

    #[test]
    fn small_tail_merges_into_its_predecessor() {
        let config = config(60, 0, 1024);
        let mut count = 1;
        // Find a text whose greedy packing leaves a tail below min_tail_tokens.
        let (text, packed) = loop {
            let text = sentences(count);
            let tokens = TokenIndex::new(&text, 0, text.len());
            let pieces = section_pieces(&text, &tokens, &plain_sections(&text)[0].blocks, 60);
            let cores = pack(&tokens, &pieces, 60, 0);
            if cores.len() >= 3 && cores.last().unwrap().tokens < config.min_tail_tokens {
                break (text, cores.len());
            }
            count += 1;
        };
        let chunked = chunk_document(&text, false, &config);
        check_invariants(&text, &chunked);
        assert_eq!(chunked.children.len(), packed - 1);
        let last = chunked.children.last().unwrap();
        assert!(last.token_count > config.chunk_tokens);
        assert!(last.token_count <= config.chunk_tokens + config.min_tail_tokens);
    }

    #[test]
    fn overlap_is_present_bounded_and_starts_a_sentence() {
        let text = sentences(60);
        let config = config(64, 16, 1024);
        let chunked = chunk_document(&text, false, &config);
        check_invariants(&text, &chunked);
        assert!(chunked.children.len() > 5);
        assert!(overlap_of(&text, &chunked.children[0]).is_empty());
        let last = chunked.children.len() - 1;
        for child in &chunked.children[1..last] {
            let overlap = overlap_of(&text, child);
            assert!(overlap.starts_with("Sentence number"), "{overlap:?}");
            assert!(count_tokens(overlap.trim_end()) <= config.overlap_tokens);
            assert!(child.token_count <= config.chunk_tokens + config.overlap_tokens);
        }
    }

    #[test]
    fn overlap_without_sentence_boundary_falls_back_to_words() {
        let words: String = (0..400).map(|index| format!("word{index} ")).collect();
        let config = config(64, 12, 1024);
        let chunked = chunk_document(&words, false, &config);
        check_invariants(&words, &chunked);
        for child in &chunked.children[1..] {
            let overlap = overlap_of(&words, child);
            assert!(overlap.starts_with("word"), "{overlap:?}");
            assert!(count_tokens(overlap.trim_end()) <= config.overlap_tokens);
        }
    }

    #[test]
    fn spans_are_char_offsets() {
        let text = "# Überblick\n\nÄrger über Öl. 数据复制很重要。\n\n## Zweiter\n\nMehr Text.";
        let chunked = chunk_document(text, true, &ChunkerConfig::default());
        check_invariants(text, &chunked);
        assert_eq!(
            char_slice(text, chunked.children[1].span),
            "## Zweiter\n\nMehr Text."
        );
    }

    #[test]
    fn parents_cover_children_and_respect_sections() {
        let mut text = String::new();
        for section in 0..6 {
            text.push_str(&format!(
                "## Section {section}\n\n{}\n\n",
                sentences(30 + section * 10)
            ));
        }
        for small in 0..4 {
            text.push_str(&format!("## Small {small}\n\nShort body {small}.\n\n"));
        }
        let config = config(64, 8, 256);
        let chunked = chunk_document(&text, true, &config);
        check_invariants(&text, &chunked);
        for parent in &chunked.parents {
            let children: Vec<_> = chunked
                .children
                .iter()
                .filter(|child| child.parent_position == parent.position)
                .collect();
            let sections: std::collections::BTreeSet<_> = children
                .iter()
                .map(|child| child.heading_path.clone())
                .collect();
            if sections.len() > 1 {
                // Only small whole sections share a parent.
                assert!(
                    sections.iter().all(|path| path[0].starts_with("Small")),
                    "{sections:?}"
                );
                assert!(!parent.text.starts_with("[Context:"));
            } else {
                let path = sections.into_iter().next().unwrap();
                assert!(
                    parent
                        .text
                        .starts_with(&format!("[Context: {}]\n", path.join(" > ")))
                );
            }
            let own: usize = children
                .iter()
                .map(|child| count_tokens(&char_slice(&text, child.span)))
                .sum();
            assert!(children.len() == 1 || own <= config.parent_tokens + 8);
        }
        assert!(chunked.parents.len() > 6);
    }

    // -----------------------------------------------------------------------------------
    // Property tests
    // -----------------------------------------------------------------------------------

    #[derive(Debug, Clone)]
    enum GeneratedBlock {
        Heading(usize, Vec<String>),
        Paragraph(Vec<String>),
        Cjk(Vec<usize>),
        Code(Vec<Vec<String>>),
        Table(Vec<Vec<String>>),
        List(Vec<Vec<String>>),
    }

    const CJK_SENTENCES: &[&str] = &[
        "系统会先把文档切分成较小的片段，然后计算向量。",
        "当用户提出问题时，系统找出最相关的片段！",
        "这真的有用吗？",
        "代码块、表格和列表保持完整；",
        "标题路径会注入到每个片段的开头",
    ];

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => "[a-z]{1,9}",
            1 => "[a-z]{1,9}[.,;:!?]",
        ]
    }

    fn words(range: std::ops::Range<usize>) -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(word(), range)
    }

    fn block() -> impl Strategy<Value = GeneratedBlock> {
        prop_oneof![
            2 => (1usize..4, words(1..5)).prop_map(|(level, words)| GeneratedBlock::Heading(level, words)),
            4 => words(1..120).prop_map(GeneratedBlock::Paragraph),
            1 => words(200..700).prop_map(GeneratedBlock::Paragraph),
            2 => prop::collection::vec(0..CJK_SENTENCES.len(), 1..60).prop_map(GeneratedBlock::Cjk),
            1 => prop::collection::vec(words(1..8), 1..20).prop_map(GeneratedBlock::Code),
            1 => prop::collection::vec(words(1..8), 100..300).prop_map(GeneratedBlock::Code),
            1 => prop::collection::vec(words(1..4), 1..30).prop_map(GeneratedBlock::Table),
            1 => prop::collection::vec(words(1..12), 1..15).prop_map(GeneratedBlock::List),
        ]
    }

    /// A document and the byte ranges of its atomic blocks.
    fn render(blocks: &[GeneratedBlock]) -> (String, Vec<(usize, usize)>) {
        let mut text = String::new();
        let mut atomic = Vec::new();
        for block in blocks {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            let start = text.len();
            match block {
                GeneratedBlock::Heading(level, words) => {
                    text.push_str(&format!("{} {}", "#".repeat(*level), words.join(" ")));
                }
                GeneratedBlock::Paragraph(words) => text.push_str(&words.join(" ")),
                GeneratedBlock::Cjk(sentences) => {
                    for &index in sentences {
                        text.push_str(CJK_SENTENCES[index]);
                    }
                }
                GeneratedBlock::Code(lines) => {
                    text.push_str("```text\n");
                    for line in lines {
                        text.push_str(&format!("  {}\n", line.join(" ")));
                    }
                    text.push_str("```");
                    atomic.push((start, text.len()));
                }
                GeneratedBlock::Table(rows) => {
                    let rows: Vec<String> = rows
                        .iter()
                        .map(|cells| format!("| {} |", cells.join(" | ")))
                        .collect();
                    text.push_str(&rows.join("\n"));
                    atomic.push((start, text.len()));
                }
                GeneratedBlock::List(items) => {
                    let items: Vec<String> = items
                        .iter()
                        .map(|item| format!("- {}", item.join(" ")))
                        .collect();
                    text.push_str(&items.join("\n"));
                }
            }
        }
        (text, atomic)
    }

    fn non_whitespace(text: &str) -> String {
        text.chars().filter(|c| !c.is_whitespace()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn chunking_covers_text_and_keeps_atomic_blocks_whole(
            blocks in prop::collection::vec(block(), 1..14),
            chunk_tokens in 48usize..300,
            overlap_tokens in 0usize..40,
            parent_tokens in 200usize..1500,
        ) {
            let (text, atomic) = render(&blocks);
            let config = config(chunk_tokens, overlap_tokens, parent_tokens);
            let chunked = chunk_document(&text, true, &config);
            check_invariants(&text, &chunked);

            // (a) Spans in order, non-overlapping, covering every non-whitespace char.
            let covered: String = chunked
                .children
                .iter()
                .map(|child| char_slice(&text, child.span))
                .collect();
            prop_assert_eq!(non_whitespace(&covered), non_whitespace(&text));

            // (b) Every fence and table lies whole in exactly one child's body and own text.
            let mut chars = CharOffsets::new(&text);
            for &(start, end) in &atomic {
                let span = (chars.at(start), chars.at(end));
                let owners = chunked
                    .children
                    .iter()
                    .filter(|child| child.span.0 <= span.0 && span.1 <= child.span.1)
                    .count();
                prop_assert_eq!(owners, 1, "atomic block {:?} split", &text[start..end]);
                let in_bodies = chunked
                    .children
                    .iter()
                    .filter(|child| {
                        let body_start = child.span.1 - child.body.chars().count() as u32;
                        body_start < span.1 && span.0 < child.span.1
                    })
                    .count();
                prop_assert_eq!(in_bodies, 1, "atomic block repeated as overlap");
            }

            // (c) Size bound, unless the child holds an atomic block too big for a chunk.
            let bound = config.chunk_tokens + config.min_tail_tokens + config.overlap_tokens;
            for child in &chunked.children {
                // The chunk budget, as the chunker computes it for this heading path.
                let budget = config
                    .chunk_tokens
                    .saturating_sub(count_tokens(&context_prefix(&child.heading_path)))
                    .max(config.chunk_tokens / 2);
                let body_start = child.span.1 as usize - child.body.chars().count();
                let body_start = text.char_indices().nth(body_start).map_or(text.len(), |(byte, _)| byte);
                // Exempt: an atomic block that, with what must precede it in this chunk (its
                // section's headings), cannot fit the budget.
                let holds_large_atomic = atomic.iter().any(|&(start, end)| {
                    body_start <= start
                        && child.body.contains(&text[start..end])
                        && count_tokens(&text[body_start..end]) > budget
                });
                prop_assert!(
                    child.token_count <= bound || holds_large_atomic,
                    "child of {} tokens exceeds {}: {:?}", child.token_count, bound, child.text
                );
            }

            // (d) No empty chunk.
            prop_assert!(chunked.children.iter().all(|child| !child.body.trim().is_empty()));
            prop_assert!(chunked.parents.iter().all(|parent| !parent.text.trim().is_empty()));
        }
    }

    #[test]
    fn markdown_pages_split_a_section_where_a_page_starts_and_keep_tables_whole() {
        let first = "# Lighthouses\n\nThe Skerryvore light stands on a reef.\n\n";
        let second = "The keepers rowed out each month.\n\n| Light | Range |\n|---|---|\n| Skerryvore | 18 |\n";
        let text = format!("{first}{second}");
        let pages = vec![
            Page {
                number: 1,
                start: 0,
                end: first.len(),
                heading_path: Vec::new(),
            },
            Page {
                number: 2,
                start: first.len(),
                end: text.len(),
                heading_path: Vec::new(),
            },
        ];
        let chunked = chunk_markdown_pages(&text, &pages, &config(400, 0, 2000));
        let on = |needle: &str| {
            chunked
                .children
                .iter()
                .find(|child| child.body.contains(needle))
                .unwrap_or_else(|| panic!("{needle}: {chunked:#?}"))
        };
        assert_eq!(on("reef").pages, Some((1, 1)));
        assert_eq!(on("keepers").pages, Some((2, 2)));
        assert!(on("| Light | Range |").body.contains("| Skerryvore | 18 |"));
        for child in &chunked.children {
            let (first_page, last_page) = child.pages.expect("every chunk has its page");
            assert_eq!(first_page, last_page);
            assert_eq!(child.heading_path, ["Lighthouses"]);
            assert!(!(child.body.contains("reef") && child.body.contains("keepers")));
        }
        assert_eq!(chunked.parents[0].pages, Some((1, 2)));
    }
}
