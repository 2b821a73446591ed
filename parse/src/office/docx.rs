//! Word (`.docx`) -> Markdown.
//!
//! The main part (`word/document.xml`, or wherever the package relationship points) is walked
//! once. A paragraph whose style is `Title` or `Heading N` (by style name, which Word keeps in
//! English whatever the UI language, or by an outline level on the style or the paragraph,
//! following `basedOn` chains) becomes a heading; a paragraph with numbering (its own or its
//! style's) becomes a list item at its level; tables become pipe tables (a nested table is
//! flattened into its cell; a merged cell stands in every grid cell it covers). A comment, a
//! footnote and an endnote are written after the paragraph that carries their reference
//! (`Comment (author): ...`, `Footnote 1: ...`, `Endnote 1: ...`, numbered in reference
//! order as Word shows them), so each is indexed under the same heading as the text it
//! annotates. The headers and footers the sections use follow the body under
//! `# Headers and footers`, each distinct text once (`Header: ...`, `Footer: ...`), so that a
//! header repeated on every section is indexed once and never joins a body chunk. A picture
//! (`a:blip`) of a paragraph is placed after it as a marker for OCR ([`super::Pictures`]);
//! the comments, notes and pictures of a table's cells follow the table. Deleted revisions
//! (`w:delText`), field codes and the `mc:Fallback` copies of drawings are left out.

use std::collections::HashMap;

use super::container::{Container, parent_dir, resolve};
use super::markdown::MarkdownOut;
use super::xml::{FallbackSkip, Node, XmlWalker, collapse, root_name, texts_of};
use super::{OfficeLimits, Pictures, zip_kind_mismatch};
use crate::parse::{ParseError, Picture, SourceFormat};

/// Longest `basedOn` chain followed when resolving a style.
const MAX_STYLE_CHAIN: usize = 16;

/// Returns the document's title (core properties, else its first `Title` paragraph), its
/// Markdown and its pictures (each after the paragraph that holds it).
pub(crate) fn docx_to_markdown(
    bytes: &[u8],
    limits: &OfficeLimits,
) -> Result<(Option<String>, String, Vec<Picture>), ParseError> {
    let mut container = Container::open(bytes, limits)?;
    let main = main_part(&mut container, "word/document.xml")?
        .filter(|part| container.has(part))
        .ok_or_else(|| zip_kind_mismatch(&container, SourceFormat::Docx))?;
    let dir = parent_dir(&main).to_string();
    let styles = match container.read_text(&format!("{dir}/styles.xml"))? {
        Some(xml) => Styles::parse(&xml)?,
        None => Styles::default(),
    };
    let numbering = match container.read_text(&format!("{dir}/numbering.xml"))? {
        Some(xml) => Numbering::parse(&xml)?,
        None => Numbering::default(),
    };
    let relationships = part_relationships(&mut container, &main)?;
    let comments = read_notes(&mut container, &relationships, NoteKind::Comment)?;
    let footnotes = read_notes(&mut container, &relationships, NoteKind::Footnote)?;
    let endnotes = read_notes(&mut container, &relationships, NoteKind::Endnote)?;
    let core_title = core_title(&mut container)?;
    let xml = container
        .read_text(&main)?
        .ok_or_else(|| ParseError::InvalidDocument(format!("no {main}")))?;
    // The package's main part may be a workbook's or a presentation's.
    if root_name(&xml, &main)?.is_some_and(|root| root != "document") {
        return Err(zip_kind_mismatch(&container, SourceFormat::Docx));
    }
    let context = Context {
        styles: &styles,
        numbering: &numbering,
        comments: &comments,
        footnotes: &footnotes,
        endnotes: &endnotes,
    };
    let mut pictures = Pictures::default();
    let mut out = MarkdownOut::default();
    let body = body_to_markdown(
        &xml,
        &main,
        &context,
        &relationships,
        &mut pictures,
        &mut out,
    )?;
    write_headers_and_footers(
        &mut container,
        &relationships,
        &body.section_parts,
        &mut out,
    )?;
    let first_title = body.title;
    let mut markdown = out.finish();
    let pictures = pictures.resolve(&mut container, &mut markdown)?;
    Ok((core_title.or(first_title), markdown, pictures))
}

/// The target of the package's `officeDocument` relationship (`default` without one).
pub(crate) fn main_part(
    container: &mut Container<'_>,
    default: &str,
) -> Result<Option<String>, ParseError> {
    let Some(rels) = container.read_text("_rels/.rels")? else {
        return Ok(Some(default.to_string()));
    };
    Ok(relationships(&rels, "_rels/.rels", "")?
        .into_iter()
        .find(|relationship| relationship.kind.ends_with("/officeDocument"))
        .map(|relationship| relationship.target))
}

/// One internal relationship of a part, its target resolved to a zip path.
#[derive(Debug, Clone)]
pub(crate) struct Relationship {
    pub(crate) id: String,
    /// The relationship type URI (`.../officeDocument`, `.../comments`).
    pub(crate) kind: String,
    pub(crate) target: String,
}

/// Every internal relationship in a `.rels` part whose source part lies in `source_dir`.
pub(crate) fn relationships(
    xml: &str,
    part: &str,
    source_dir: &str,
) -> Result<Vec<Relationship>, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    let mut found = Vec::new();
    while let Some(node) = walker.next_node()? {
        if node.is_open("Relationship")
            && node.attribute("TargetMode") != Some("External")
            && let (Some(kind), Some(target)) = (node.attribute("Type"), node.attribute("Target"))
        {
            found.push(Relationship {
                id: node.attribute("Id").unwrap_or("").to_string(),
                kind: kind.to_string(),
                target: resolve(source_dir, target),
            });
        }
    }
    Ok(found)
}

/// The relationships of `part` (none when it has no `.rels` part).
pub(crate) fn part_relationships(
    container: &mut Container<'_>,
    part: &str,
) -> Result<Vec<Relationship>, ParseError> {
    let rels = rels_part(part);
    match container.read_text(&rels)? {
        Some(xml) => relationships(&xml, &rels, parent_dir(part)),
        None => Ok(Vec::new()),
    }
}

/// The `.rels` part of `part` (`word/document.xml` -> `word/_rels/document.xml.rels`).
fn rels_part(part: &str) -> String {
    match part.rsplit_once('/') {
        Some((dir, file)) => format!("{dir}/_rels/{file}.rels"),
        None => format!("_rels/{part}.rels"),
    }
}

/// `dc:title` of `docProps/core.xml`.
pub(crate) fn core_title(container: &mut Container<'_>) -> Result<Option<String>, ParseError> {
    let Some(xml) = container.read_text("docProps/core.xml")? else {
        return Ok(None);
    };
    Ok(texts_of(&xml, "docProps/core.xml", "title")?
        .into_iter()
        .next())
}

/// The annotations a paragraph can reference, each in a part of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoteKind {
    /// `w:comment` in `comments.xml`, referenced by `w:commentReference`.
    Comment,
    /// `w:footnote` in `footnotes.xml`, referenced by `w:footnoteReference`.
    Footnote,
    /// `w:endnote` in `endnotes.xml`, referenced by `w:endnoteReference`.
    Endnote,
}

impl NoteKind {
    /// The element of one note and the tail of its part's relationship type.
    fn element(self) -> &'static str {
        match self {
            NoteKind::Comment => "comment",
            NoteKind::Footnote => "footnote",
            NoteKind::Endnote => "endnote",
        }
    }

    fn relationship(self) -> &'static str {
        match self {
            NoteKind::Comment => "/comments",
            NoteKind::Footnote => "/footnotes",
            NoteKind::Endnote => "/endnotes",
        }
    }
}

/// One comment, footnote or endnote: its author (comments only) and its text on one line.
#[derive(Debug, Clone)]
struct Note {
    author: String,
    text: String,
}

/// Note id -> note, from the parts of `kind` the main part's `relationships` name. Footnote
/// separators (`w:type="separator"` and the like) have no text and are left out.
fn read_notes(
    container: &mut Container<'_>,
    relationships: &[Relationship],
    kind: NoteKind,
) -> Result<HashMap<String, Note>, ParseError> {
    let mut notes = HashMap::new();
    let element = kind.element();
    for relationship in relationships {
        if !relationship.kind.ends_with(kind.relationship()) {
            continue;
        }
        let target = &relationship.target;
        let Some(xml) = container.read_text(target)? else {
            continue;
        };
        let mut walker = XmlWalker::new(&xml, target);
        let mut current: Option<(String, Note)> = None;
        let mut in_text = false;
        let mut fallback = FallbackSkip::default();
        while let Some(node) = walker.next_node()? {
            if fallback.skips(&node) {
                continue;
            }
            match &node {
                node if node.is_open(element) => {
                    let note = Note {
                        author: collapse(node.attribute("author").unwrap_or("")),
                        text: String::new(),
                    };
                    current = Some((node.attribute("id").unwrap_or("").to_string(), note));
                }
                node if node.is_close(element) => {
                    if let Some((id, mut note)) = current.take() {
                        note.text = collapse(&note.text);
                        if !note.text.is_empty() {
                            notes.insert(id, note);
                        }
                    }
                }
                node if node.is_open("t") => in_text = true,
                node if node.is_close("t") => in_text = false,
                node if node.is_close("p") || node.is_open("tab") || node.is_open("br") => {
                    if let Some((_, note)) = current.as_mut() {
                        note.text.push(' ');
                    }
                }
                Node::Text(text) if in_text => {
                    if let Some((_, note)) = current.as_mut() {
                        note.text.push_str(text);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(notes)
}

/// The `# Headers and footers` section: the header and footer parts the sections reference
/// (`section_parts`, relationship ids in document order), each distinct text once.
fn write_headers_and_footers(
    container: &mut Container<'_>,
    relationships: &[Relationship],
    section_parts: &[String],
    out: &mut MarkdownOut,
) -> Result<(), ParseError> {
    let mut seen: Vec<String> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    for id in section_parts {
        let Some(relationship) = relationships.iter().find(|r| &r.id == id) else {
            continue;
        };
        let label = if relationship.kind.ends_with("/header") {
            "Header"
        } else if relationship.kind.ends_with("/footer") {
            "Footer"
        } else {
            continue;
        };
        if seen.contains(&relationship.target) {
            continue;
        }
        seen.push(relationship.target.clone());
        let Some(xml) = container.read_text(&relationship.target)? else {
            continue;
        };
        let text = part_text(&xml, &relationship.target)?;
        if text.is_empty() {
            continue;
        }
        let line = format!("{label}: {text}");
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    if !lines.is_empty() {
        out.heading(1, "Headers and footers");
        for line in &lines {
            out.paragraph(line);
        }
    }
    Ok(())
}

/// Every `w:t` of a header or footer part on one line, paragraphs and cells apart, the
/// `mc:Fallback` copies of drawings left out.
fn part_text(xml: &str, part: &str) -> Result<String, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    let mut text = String::new();
    let mut in_text = false;
    let mut fallback = FallbackSkip::default();
    while let Some(node) = walker.next_node()? {
        if fallback.skips(&node) {
            continue;
        }
        match &node {
            node if node.is_open("t") => in_text = true,
            node if node.is_close("t") => in_text = false,
            node if node.is_close("p") || node.is_open("tab") || node.is_open("br") => {
                text.push(' ')
            }
            Node::Text(piece) if in_text => text.push_str(piece),
            _ => {}
        }
    }
    Ok(collapse(&text))
}

/// What a paragraph style makes of its paragraphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StyleRole {
    Title,
    Heading(usize),
    List,
    Body,
}

#[derive(Debug, Default)]
struct StyleInfo {
    name: Option<String>,
    based_on: Option<String>,
    outline_level: Option<usize>,
    numbered: bool,
    num_id: Option<String>,
    list_level: Option<usize>,
}

#[derive(Debug, Default)]
struct Styles {
    by_id: HashMap<String, StyleInfo>,
}

impl Styles {
    fn parse(xml: &str) -> Result<Styles, ParseError> {
        let mut walker = XmlWalker::new(xml, "styles.xml");
        let mut by_id = HashMap::new();
        let mut current: Option<(String, StyleInfo)> = None;
        while let Some(node) = walker.next_node()? {
            if node.is_open("style") {
                current = (node.attribute("type") == Some("paragraph")).then(|| {
                    (
                        node.attribute("styleId").unwrap_or("").to_string(),
                        StyleInfo::default(),
                    )
                });
                continue;
            }
            if node.is_close("style") {
                if let Some((id, info)) = current.take() {
                    by_id.insert(id, info);
                }
                continue;
            }
            let Some((_, info)) = current.as_mut() else {
                continue;
            };
            if node.is_open("name") {
                info.name = node.attribute("val").map(str::to_string);
            } else if node.is_open("basedOn") {
                info.based_on = node.attribute("val").map(str::to_string);
            } else if node.is_open("outlineLvl") {
                info.outline_level = node.attribute("val").and_then(|v| v.parse().ok());
            } else if node.is_open("numPr") {
                info.numbered = true;
            } else if node.is_open("numId") {
                info.num_id = node.attribute("val").map(str::to_string);
            } else if node.is_open("ilvl") {
                info.list_level = node.attribute("val").and_then(|v| v.parse().ok());
            }
        }
        Ok(Styles { by_id })
    }

    /// The numbering of style `id` (`numId`, level), following `basedOn`. A style named
    /// `List Bullet 2` is at level 1 even where its numbering says 0 (Word indents those
    /// styles rather than giving them a level).
    fn numbering(&self, id: &str) -> (Option<String>, Option<usize>) {
        let mut num_id = None;
        let mut level = None;
        let mut current = id;
        for _ in 0..MAX_STYLE_CHAIN {
            let Some(info) = self.by_id.get(current) else {
                break;
            };
            if level.is_none() {
                level = info
                    .name
                    .as_deref()
                    .and_then(level_by_name)
                    .or(info.list_level);
            }
            if num_id.is_none() {
                num_id = info.num_id.clone();
            }
            match info.based_on.as_deref() {
                Some(parent) if parent != current => current = parent,
                _ => break,
            }
        }
        (num_id, level)
    }

    /// The role of style `id`, following `basedOn` (at most [`MAX_STYLE_CHAIN`] steps).
    fn role(&self, id: &str) -> StyleRole {
        let mut current = id;
        for _ in 0..MAX_STYLE_CHAIN {
            let info = self.by_id.get(current);
            let name = info
                .and_then(|info| info.name.as_deref())
                .unwrap_or(current)
                .to_ascii_lowercase();
            if let Some(role) = role_by_name(&name) {
                return role;
            }
            let Some(info) = info else {
                return StyleRole::Body;
            };
            if let Some(level) = info.outline_level.filter(|level| *level < 9) {
                return StyleRole::Heading(level + 1);
            }
            if info.numbered {
                return StyleRole::List;
            }
            match info.based_on.as_deref() {
                Some(parent) if parent != current => current = parent,
                _ => return StyleRole::Body,
            }
        }
        StyleRole::Body
    }
}

/// The level of a `List Bullet 3` / `List Number 2` style name (0-based).
fn level_by_name(name: &str) -> Option<usize> {
    let lower = name.to_ascii_lowercase();
    let rest = lower.strip_prefix("list ")?;
    let digits = rest.rsplit(' ').next()?;
    digits
        .parse::<usize>()
        .ok()
        .filter(|n| (2..=9).contains(n))
        .map(|n| n - 1)
}

/// Whether each numbering definition (`numId`, level) counts (`decimal`, `lowerLetter`, ...)
/// or shows a bullet.
#[derive(Debug, Default)]
struct Numbering {
    /// abstractNumId -> level -> counts.
    abstract_formats: HashMap<String, HashMap<usize, bool>>,
    /// numId -> abstractNumId.
    instances: HashMap<String, String>,
}

impl Numbering {
    fn parse(xml: &str) -> Result<Numbering, ParseError> {
        let mut walker = XmlWalker::new(xml, "numbering.xml");
        let mut numbering = Numbering::default();
        let mut abstract_id: Option<String> = None;
        let mut level: Option<usize> = None;
        let mut num_id: Option<String> = None;
        while let Some(node) = walker.next_node()? {
            match &node {
                node if node.is_open("abstractNum") => {
                    abstract_id = node.attribute("abstractNumId").map(str::to_string);
                }
                node if node.is_close("abstractNum") => abstract_id = None,
                node if node.is_open("lvl") => {
                    level = node.attribute("ilvl").and_then(|v| v.parse().ok());
                }
                node if node.is_open("numFmt") => {
                    if let (Some(id), Some(level), Some(format)) =
                        (abstract_id.as_ref(), level, node.attribute("val"))
                    {
                        numbering
                            .abstract_formats
                            .entry(id.clone())
                            .or_default()
                            .insert(level, !matches!(format, "bullet" | "none"));
                    }
                }
                node if node.is_open("num") => {
                    num_id = node.attribute("numId").map(str::to_string);
                }
                node if node.is_open("abstractNumId") => {
                    if let (Some(num), Some(abstract_num)) =
                        (num_id.as_ref(), node.attribute("val"))
                    {
                        numbering
                            .instances
                            .insert(num.clone(), abstract_num.to_string());
                    }
                }
                node if node.is_close("num") => num_id = None,
                _ => {}
            }
        }
        Ok(numbering)
    }

    /// Whether items of `num_id` at `level` are numbered (bullets when unknown).
    fn counts(&self, num_id: &str, level: usize) -> bool {
        self.instances
            .get(num_id)
            .and_then(|abstract_id| self.abstract_formats.get(abstract_id))
            .and_then(|levels| levels.get(&level).or_else(|| levels.get(&0)))
            .copied()
            .unwrap_or(false)
    }
}

/// `"title"`, `"heading 2"` (or an id such as `"Heading2"`), `"list bullet"`.
fn role_by_name(name: &str) -> Option<StyleRole> {
    let compact: String = name.chars().filter(|c| !c.is_whitespace()).collect();
    if compact == "title" {
        return Some(StyleRole::Title);
    }
    if let Some(level) = compact.strip_prefix("heading")
        && let Ok(level) = level.parse::<usize>()
        && (1..=9).contains(&level)
    {
        return Some(StyleRole::Heading(level));
    }
    if compact.starts_with("list") && compact != "listparagraph" {
        return Some(StyleRole::List);
    }
    None
}

/// What the walk over the main part looks things up in.
struct Context<'a> {
    styles: &'a Styles,
    numbering: &'a Numbering,
    comments: &'a HashMap<String, Note>,
    footnotes: &'a HashMap<String, Note>,
    endnotes: &'a HashMap<String, Note>,
}

impl Context<'_> {
    /// The line written for a reference to note `id` of `kind`; `number` is the footnote or
    /// endnote number Word shows (`None` for a custom mark).
    fn note_line(&self, kind: NoteKind, id: &str, number: Option<usize>) -> Option<String> {
        let (notes, label) = match kind {
            NoteKind::Comment => (self.comments, "Comment"),
            NoteKind::Footnote => (self.footnotes, "Footnote"),
            NoteKind::Endnote => (self.endnotes, "Endnote"),
        };
        let note = notes.get(id)?;
        Some(match (kind, number) {
            (NoteKind::Comment, _) if !note.author.is_empty() => {
                format!("{label} ({}): {}", note.author, note.text)
            }
            (NoteKind::Comment, _) | (_, None) => format!("{label}: {}", note.text),
            (_, Some(number)) => format!("{label} {number}: {}", note.text),
        })
    }
}

/// What the walk over the main part found besides its Markdown.
struct Body {
    /// The first `Title` paragraph's text.
    title: Option<String>,
    /// Relationship ids of the header and footer parts the sections reference, in order.
    section_parts: Vec<String>,
}

#[derive(Debug, Default)]
struct Paragraph {
    style: Option<String>,
    outline_level: Option<usize>,
    list_level: Option<usize>,
    num_id: Option<String>,
    text: String,
    /// Its comments, footnotes and endnotes, each a line to write after it.
    notes: Vec<String>,
    /// Relationship ids of its pictures (`a:blip r:embed`).
    pictures: Vec<String>,
}

#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
    /// Grid columns the open cell spans (`w:gridSpan`), when more than one.
    span: Option<usize>,
    /// The open cell continues a vertical merge (`w:vMerge` without `restart`).
    continues: bool,
}

/// Most grid columns one cell may span: a larger `w:gridSpan` is taken as this.
const MAX_CELL_SPAN: usize = 64;

impl Table {
    /// Ends the open cell. A merged cell's text stands in every grid cell it covers, as
    /// python-docx reads it, so that each column of the Markdown table lines up with its
    /// header and each row holds its own values.
    fn end_cell(&mut self) {
        let mut cell = std::mem::take(&mut self.cell);
        if std::mem::take(&mut self.continues)
            && cell.trim().is_empty()
            && let Some(above) = self.rows.last().and_then(|row| row.get(self.row.len()))
        {
            cell = above.clone();
        }
        let span = self.span.take().unwrap_or(1);
        for _ in 1..span {
            self.row.push(cell.clone());
        }
        self.row.push(cell);
    }
}

/// Walks the main part, writing its Markdown to `out`.
fn body_to_markdown(
    xml: &str,
    part: &str,
    context: &Context<'_>,
    relationships: &[Relationship],
    pictures: &mut Pictures,
    out: &mut MarkdownOut,
) -> Result<Body, ParseError> {
    let styles = context.styles;
    // Footnotes and endnotes are numbered in the order of their references.
    let mut footnote_number = 0usize;
    let mut endnote_number = 0usize;
    let mut section_parts: Vec<String> = Vec::new();
    // The next number of each numbered list, by (numId, level).
    let mut counters: HashMap<(String, usize), usize> = HashMap::new();
    let mut walker = XmlWalker::new(xml, part);
    let mut title = None;
    let mut paragraphs: Vec<Paragraph> = Vec::new();
    let mut tables: Vec<Table> = Vec::new();
    // Notes and pictures of paragraphs inside a table, written after the table (a marker
    // paragraph inside a cell would break the table).
    let mut table_notes: Vec<String> = Vec::new();
    let mut table_pictures: Vec<String> = Vec::new();
    let mut in_text = false;
    let mut fallback = FallbackSkip::default();
    while let Some(node) = walker.next_node()? {
        if fallback.skips(&node) {
            continue;
        }
        match &node {
            Node::Text(text) => {
                if in_text && let Some(paragraph) = paragraphs.last_mut() {
                    paragraph.text.push_str(text);
                }
            }
            Node::Open { name, .. } => match name.as_str() {
                "p" => paragraphs.push(Paragraph::default()),
                "t" => in_text = true,
                "tab" | "br" | "cr" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.text.push(' ');
                    }
                }
                "pStyle" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.style = node.attribute("val").map(str::to_string);
                    }
                }
                "outlineLvl" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.outline_level =
                            node.attribute("val").and_then(|v| v.parse().ok());
                    }
                }
                "numPr" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.list_level.get_or_insert(0);
                    }
                }
                "ilvl" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.list_level = node.attribute("val").and_then(|v| v.parse().ok());
                    }
                }
                "numId" => {
                    if let Some(paragraph) = paragraphs.last_mut() {
                        paragraph.num_id = node.attribute("val").map(str::to_string);
                    }
                }
                "commentReference" | "footnoteReference" | "endnoteReference" => {
                    let (kind, counter) = match name.as_str() {
                        "commentReference" => (NoteKind::Comment, None),
                        "footnoteReference" => (NoteKind::Footnote, Some(&mut footnote_number)),
                        _ => (NoteKind::Endnote, Some(&mut endnote_number)),
                    };
                    // A custom mark (`w:customMarkFollows`) takes no number.
                    let custom = matches!(node.attribute("customMarkFollows"), Some("1" | "true"));
                    let number = counter.filter(|_| !custom).map(|counter| {
                        *counter += 1;
                        *counter
                    });
                    if let (Some(paragraph), Some(line)) = (
                        paragraphs.last_mut(),
                        node.attribute("id")
                            .and_then(|id| context.note_line(kind, id, number)),
                    ) {
                        paragraph.notes.push(line);
                    }
                }
                "headerReference" | "footerReference" => {
                    if let Some(id) = node.prefixed_attribute("id") {
                        section_parts.push(id.to_string());
                    }
                }
                "tbl" => tables.push(Table::default()),
                "gridSpan" => {
                    if let Some(table) = tables.last_mut() {
                        table.span = node
                            .attribute("val")
                            .and_then(|v| v.parse::<usize>().ok())
                            .map(|span| span.clamp(1, MAX_CELL_SPAN));
                    }
                }
                "vMerge" => {
                    if let Some(table) = tables.last_mut() {
                        table.continues = node.attribute("val") != Some("restart");
                    }
                }
                "blip" => {
                    if let (Some(paragraph), Some(id)) =
                        (paragraphs.last_mut(), node.prefixed_attribute("embed"))
                    {
                        paragraph.pictures.push(id.to_string());
                    }
                }
                _ => {}
            },
            Node::Close { name } => match name.as_str() {
                "t" => in_text = false,
                "p" => {
                    let Some(paragraph) = paragraphs.pop() else {
                        continue;
                    };
                    if let Some(table) = tables.last_mut() {
                        push_words(&mut table.cell, &paragraph.text);
                        table_notes.extend(paragraph.notes);
                        table_pictures.extend(paragraph.pictures);
                        continue;
                    }
                    if let Some(outer) = paragraphs.last_mut() {
                        // A text box inside a paragraph: its text joins the paragraph.
                        push_words(&mut outer.text, &paragraph.text);
                        outer.notes.extend(paragraph.notes);
                        outer.pictures.extend(paragraph.pictures);
                        continue;
                    }
                    let role = paragraph_role(&paragraph, styles);
                    match role {
                        StyleRole::Title => {
                            if title.is_none() {
                                title = Some(collapse(&paragraph.text));
                            }
                            out.heading(1, &paragraph.text);
                        }
                        StyleRole::Heading(level) => out.heading(level, &paragraph.text),
                        StyleRole::List => {
                            let (style_num_id, style_level) = paragraph
                                .style
                                .as_deref()
                                .map_or((None, None), |style| styles.numbering(style));
                            let level = paragraph.list_level.or(style_level).unwrap_or(0);
                            let num_id = paragraph.num_id.clone().or(style_num_id);
                            let number = num_id
                                .filter(|id| id != "0" && context.numbering.counts(id, level))
                                .map(|id| {
                                    counters.retain(|(other, deeper), _| {
                                        *other != id || *deeper <= level
                                    });
                                    let next = counters.entry((id, level)).or_insert(0);
                                    *next += 1;
                                    *next
                                });
                            out.numbered_item(level, number, &paragraph.text)
                        }
                        StyleRole::Body => out.paragraph(&paragraph.text),
                    }
                    for note in &paragraph.notes {
                        out.paragraph(note);
                    }
                    for id in &paragraph.pictures {
                        if let Some(picture) = relationships.iter().find(|r| &r.id == id) {
                            pictures.place(out, picture.target.clone());
                        }
                    }
                }
                "tc" => {
                    if let Some(table) = tables.last_mut() {
                        table.end_cell();
                    }
                }
                "tr" => {
                    if let Some(table) = tables.last_mut() {
                        let row = std::mem::take(&mut table.row);
                        table.rows.push(row);
                    }
                }
                "tbl" => {
                    let Some(table) = tables.pop() else {
                        continue;
                    };
                    if let Some(outer) = tables.last_mut() {
                        let flat: Vec<String> = table
                            .rows
                            .iter()
                            .map(|row| {
                                row.iter()
                                    .map(|cell| collapse(cell))
                                    .filter(|cell| !cell.is_empty())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                            .filter(|row| !row.is_empty())
                            .collect();
                        push_words(&mut outer.cell, &flat.join("; "));
                    } else {
                        out.table(&table.rows);
                        for note in table_notes.drain(..) {
                            out.paragraph(&note);
                        }
                        for id in table_pictures.drain(..) {
                            if let Some(picture) = relationships.iter().find(|r| r.id == id) {
                                pictures.place(out, picture.target.clone());
                            }
                        }
                    }
                }
                _ => {}
            },
        }
    }
    Ok(Body {
        title: title.filter(|title| !title.is_empty()),
        section_parts,
    })
}

fn paragraph_role(paragraph: &Paragraph, styles: &Styles) -> StyleRole {
    if let Some(level) = paragraph.outline_level.filter(|level| *level < 9) {
        return StyleRole::Heading(level + 1);
    }
    let by_style = paragraph
        .style
        .as_deref()
        .map_or(StyleRole::Body, |style| styles.role(style));
    match by_style {
        StyleRole::Body if paragraph.list_level.is_some() => StyleRole::List,
        role => role,
    }
}

/// Appends `text` to `buffer` with a space between them.
fn push_words(buffer: &mut String, text: &str) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    if !buffer.is_empty() {
        buffer.push(' ');
    }
    buffer.push_str(text);
}
