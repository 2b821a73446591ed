//! PowerPoint (`.pptx`) -> Markdown, one section per slide.
//!
//! Slides come in the order of the presentation's slide list. Each becomes
//! `# Slide N: <title>` (the title or centred-title placeholder; `# Slide N` without one), then
//! its text: paragraphs of body and content placeholders as `- ` items at their indent level
//! (unless the paragraph turns bullets off), other text boxes as paragraphs, tables as pipe
//! tables. The slide's speaker notes (`Speaker notes: ...`) and comments
//! (`Comment (author): ...`, from old `p:cm` parts and modern `p188:cm` parts with their
//! replies) follow under the same heading, so a hit on them names the slide.
//! The slide's pictures follow its text as markers for OCR ([`super::Pictures`]). Slide
//! numbers, dates and footers are left out.

use std::collections::HashMap;

use super::container::Container;
use super::docx::{Relationship, core_title, main_part, part_relationships};
use super::markdown::MarkdownOut;
use super::xml::{FallbackSkip, Node, XmlWalker, collapse};
use super::{OfficeLimits, Pictures, zip_kind_mismatch};
use crate::parse::{Page, ParseError, Picture, SourceFormat};

/// Returns the presentation's title (core properties, else the first slide's title), its
/// Markdown and its pictures (each after its slide's text).
pub(crate) fn pptx_to_markdown(
    bytes: &[u8],
    limits: &OfficeLimits,
) -> Result<(Option<String>, String, Vec<Picture>), ParseError> {
    let mut container = Container::open(bytes, limits)?;
    let main = main_part(&mut container, "ppt/presentation.xml")?
        .filter(|part| container.has(part) && part.ends_with("presentation.xml"))
        .ok_or_else(|| zip_kind_mismatch(&container, SourceFormat::Pptx))?;
    let relationships = part_relationships(&mut container, &main)?;
    let authors = comment_authors(&mut container, &relationships)?;
    let presentation = container
        .read_text(&main)?
        .ok_or_else(|| ParseError::InvalidDocument(format!("no {main}")))?;
    // The slide list names slides by relationship id, in show order.
    let mut slide_parts = Vec::new();
    let mut walker = XmlWalker::new(&presentation, &main);
    while let Some(node) = walker.next_node()? {
        if node.is_open("sldId")
            && let Some(id) = node.prefixed_attribute("id")
            && let Some(relationship) = relationships.iter().find(|r| r.id == id)
        {
            slide_parts.push(relationship.target.clone());
        }
    }
    let mut out = MarkdownOut::default();
    let mut pictures = Pictures::default();
    let mut first_title = None;
    for (index, part) in slide_parts.iter().enumerate() {
        let Some(xml) = container.read_text(part)? else {
            continue;
        };
        let slide = read_shapes(&xml, part)?;
        let number = index + 1;
        match &slide.title {
            Some(title) => {
                first_title.get_or_insert_with(|| title.clone());
                out.heading(1, &format!("Slide {number}: {title}"));
            }
            None => out.heading(1, &format!("Slide {number}")),
        }
        slide.write(&mut out);
        // The slide's pictures, in the order the slide draws them.
        let slide_relationships = part_relationships(&mut container, part)?;
        let mut walker = XmlWalker::new(&xml, part);
        while let Some(node) = walker.next_node()? {
            if node.is_open("blip")
                && let Some(id) = node.prefixed_attribute("embed")
                && let Some(picture) = slide_relationships.iter().find(|r| r.id == id)
            {
                pictures.place(&mut out, picture.target.clone());
            }
        }
        for relationship in slide_relationships {
            if relationship.kind.ends_with("/notesSlide") {
                let Some(xml) = container.read_text(&relationship.target)? else {
                    continue;
                };
                let notes = read_shapes(&xml, &relationship.target)?;
                let text = notes.plain_text();
                if !text.is_empty() {
                    out.paragraph(&format!("Speaker notes: {text}"));
                }
            } else if relationship.kind.ends_with("/comments") {
                let Some(xml) = container.read_text(&relationship.target)? else {
                    continue;
                };
                for comment in slide_comments(&xml, &relationship.target, &authors)? {
                    out.paragraph(&comment);
                }
            }
        }
    }
    let title = core_title(&mut container)?.or(first_title);
    let mut markdown = out.finish();
    let pictures = pictures.resolve(&mut container, &mut markdown)?;
    Ok((title, markdown, pictures))
}

/// Comment author id -> name, from the old (`commentAuthors.xml`, `p:cmAuthor`) and modern
/// (`authors.xml`, `p188:author`) author lists the presentation names.
fn comment_authors(
    container: &mut Container<'_>,
    relationships: &[Relationship],
) -> Result<HashMap<String, String>, ParseError> {
    let mut authors = HashMap::new();
    for relationship in relationships {
        if !(relationship.kind.ends_with("/commentAuthors")
            || relationship.kind.ends_with("/authors"))
        {
            continue;
        }
        let Some(xml) = container.read_text(&relationship.target)? else {
            continue;
        };
        let mut walker = XmlWalker::new(&xml, &relationship.target);
        while let Some(node) = walker.next_node()? {
            if (node.is_open("cmAuthor") || node.is_open("author"))
                && let (Some(id), Some(name)) = (node.attribute("id"), node.attribute("name"))
            {
                let name = collapse(name);
                if !name.is_empty() {
                    authors.insert(id.to_string(), name);
                }
            }
        }
    }
    Ok(authors)
}

/// The comments of a slide's comments part, each a line `Comment (author): text`: old
/// comments (`p:cm` with `p:text`) and modern ones (`p188:cm` with a `p188:txBody`), a modern
/// comment's replies (`p188:reply`) after it, in the order they open.
fn slide_comments(
    xml: &str,
    part: &str,
    authors: &HashMap<String, String>,
) -> Result<Vec<String>, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    // Every comment and reply in the order it opens: author, text.
    let mut found: Vec<(Option<String>, String)> = Vec::new();
    // Indexes into `found` of the open comment and the reply inside it.
    let mut open: Vec<usize> = Vec::new();
    let mut in_text = 0usize;
    while let Some(node) = walker.next_node()? {
        match &node {
            node if node.is_open("cm") || node.is_open("reply") => {
                let author = node
                    .attribute("authorId")
                    .and_then(|id| authors.get(id))
                    .cloned();
                open.push(found.len());
                found.push((author, String::new()));
            }
            node if node.is_close("cm") || node.is_close("reply") => {
                open.pop();
            }
            node if node.is_open("text") || node.is_open("t") => in_text += 1,
            node if node.is_close("text") || node.is_close("t") => {
                in_text = in_text.saturating_sub(1)
            }
            node if node.is_close("p") || node.is_open("br") => {
                if let Some(&index) = open.last() {
                    found[index].1.push(' ');
                }
            }
            Node::Text(text) if in_text > 0 => {
                if let Some(&index) = open.last() {
                    found[index].1.push_str(text);
                }
            }
            _ => {}
        }
    }
    Ok(found
        .into_iter()
        .filter_map(|(author, text)| {
            let text = collapse(&text);
            if text.is_empty() {
                return None;
            }
            Some(match author {
                Some(author) => format!("Comment ({author}): {text}"),
                None => format!("Comment: {text}"),
            })
        })
        .collect())
}

/// What a slide (or notes page) shows, in document order.
#[derive(Debug, Default)]
struct Shapes {
    title: Option<String>,
    blocks: Vec<Block>,
}

#[derive(Debug)]
enum Block {
    Item { level: usize, text: String },
    Paragraph(String),
    Table(Vec<Vec<String>>),
}

impl Shapes {
    fn write(&self, out: &mut MarkdownOut) {
        for block in &self.blocks {
            match block {
                Block::Item { level, text } => out.list_item(*level, text),
                Block::Paragraph(text) => out.paragraph(text),
                Block::Table(rows) => out.table(rows),
            }
        }
    }

    /// Every text as one line (speaker notes).
    fn plain_text(&self) -> String {
        let mut parts: Vec<String> = self.title.iter().cloned().collect();
        for block in &self.blocks {
            match block {
                Block::Item { text, .. } | Block::Paragraph(text) => parts.push(text.clone()),
                Block::Table(rows) => {
                    parts.extend(rows.iter().map(|row| collapse(&row.join(" "))));
                }
            }
        }
        collapse(&parts.join(" "))
    }
}

/// The role of a text shape, by its placeholder type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShapeRole {
    Title,
    /// Body and content placeholders: bulleted.
    Bulleted,
    /// Text boxes, subtitles, notes text.
    Plain,
    /// Slide numbers, dates, footers, the slide image of a notes page.
    Skipped,
}

#[derive(Debug)]
struct Shape {
    role: ShapeRole,
    paragraphs: Vec<(usize, bool, String)>,
}

#[derive(Debug, Default)]
struct TableState {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
}

/// Paragraph being read: indent level, whether bullets are off, text.
#[derive(Debug, Default)]
struct ParagraphState {
    level: usize,
    no_bullet: bool,
    text: String,
}

fn read_shapes(xml: &str, part: &str) -> Result<Shapes, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    let mut shapes = Shapes::default();
    let mut shape: Option<Shape> = None;
    let mut table: Option<TableState> = None;
    let mut paragraph: Option<ParagraphState> = None;
    let mut in_text = false;
    let mut fallback = FallbackSkip::default();
    let notes_page = part.contains("notesSlide");
    while let Some(node) = walker.next_node()? {
        if fallback.skips(&node) {
            continue;
        }
        match &node {
            Node::Text(text) => {
                if in_text && let Some(paragraph) = paragraph.as_mut() {
                    paragraph.text.push_str(text);
                }
            }
            Node::Open { name, .. } => match name.as_str() {
                "sp" => {
                    shape = Some(Shape {
                        role: ShapeRole::Plain,
                        paragraphs: Vec::new(),
                    })
                }
                "ph" => {
                    if let Some(shape) = shape.as_mut() {
                        shape.role = placeholder_role(node.attribute("type"), notes_page);
                    }
                }
                "tbl" => table = Some(TableState::default()),
                "p" => paragraph = Some(ParagraphState::default()),
                "pPr" => {
                    if let Some(paragraph) = paragraph.as_mut() {
                        paragraph.level = node
                            .attribute("lvl")
                            .and_then(|level| level.parse().ok())
                            .unwrap_or(0);
                    }
                }
                "buNone" => {
                    if let Some(paragraph) = paragraph.as_mut() {
                        paragraph.no_bullet = true;
                    }
                }
                "t" => in_text = true,
                "br" => {
                    if let Some(paragraph) = paragraph.as_mut() {
                        paragraph.text.push(' ');
                    }
                }
                _ => {}
            },
            Node::Close { name } => match name.as_str() {
                "t" => in_text = false,
                "p" => {
                    let Some(done) = paragraph.take() else {
                        continue;
                    };
                    let text = collapse(&done.text);
                    if text.is_empty() {
                        continue;
                    }
                    if let Some(table) = table.as_mut() {
                        if !table.cell.is_empty() {
                            table.cell.push(' ');
                        }
                        table.cell.push_str(&text);
                    } else if let Some(shape) = shape.as_mut() {
                        shape.paragraphs.push((done.level, done.no_bullet, text));
                    }
                }
                "tc" => {
                    if let Some(table) = table.as_mut() {
                        let cell = std::mem::take(&mut table.cell);
                        table.row.push(cell);
                    }
                }
                "tr" => {
                    if let Some(table) = table.as_mut() {
                        let row = std::mem::take(&mut table.row);
                        table.rows.push(row);
                    }
                }
                "tbl" => {
                    if let Some(done) = table.take() {
                        shapes.blocks.push(Block::Table(done.rows));
                    }
                }
                "sp" => {
                    if let Some(done) = shape.take() {
                        add_shape(&mut shapes, done);
                    }
                }
                _ => {}
            },
        }
    }
    Ok(shapes)
}

fn placeholder_role(kind: Option<&str>, notes_page: bool) -> ShapeRole {
    match kind {
        Some("title" | "ctrTitle") if !notes_page => ShapeRole::Title,
        Some("sldNum" | "dt" | "ftr" | "hdr" | "sldImg") => ShapeRole::Skipped,
        Some("subTitle") => ShapeRole::Plain,
        _ if notes_page => ShapeRole::Plain,
        // No type: a content placeholder; "body", "obj": bulleted text.
        _ => ShapeRole::Bulleted,
    }
}

fn add_shape(shapes: &mut Shapes, shape: Shape) {
    match shape.role {
        ShapeRole::Skipped => {}
        ShapeRole::Title => {
            let title = collapse(
                &shape
                    .paragraphs
                    .iter()
                    .map(|(_, _, text)| text.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            if title.is_empty() {
                return;
            }
            if shapes.title.is_none() {
                shapes.title = Some(title);
            } else {
                shapes.blocks.push(Block::Paragraph(title));
            }
        }
        ShapeRole::Bulleted => {
            for (level, no_bullet, text) in shape.paragraphs {
                shapes.blocks.push(if no_bullet {
                    Block::Paragraph(text)
                } else {
                    Block::Item { level, text }
                });
            }
        }
        ShapeRole::Plain => {
            for (_, _, text) in shape.paragraphs {
                shapes.blocks.push(Block::Paragraph(text));
            }
        }
    }
}

/// The slides of a deck's Markdown as pages: each from its `# Slide N` heading to the next
/// one (or the end), numbered by its slide. Only the converter writes a line starting with
/// `# ` (text starting with `#` is escaped), and slide numbers only grow.
pub(crate) fn slide_pages(text: &str) -> Vec<Page> {
    let mut starts: Vec<(u32, usize)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let number = line
            .strip_prefix("# Slide ")
            .map(|rest| {
                rest.trim_end()
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .and_then(|digits| digits.parse::<u32>().ok());
        if let Some(number) = number
            && starts.last().is_none_or(|(last, _)| *last < number)
        {
            starts.push((number, offset));
        }
        offset += line.len();
    }
    let ends = starts
        .iter()
        .skip(1)
        .map(|(_, start)| *start)
        .chain(std::iter::once(text.len()));
    starts
        .iter()
        .zip(ends)
        .map(|((number, start), end)| Page {
            number: *number,
            start: *start,
            end,
            heading_path: Vec::new(),
        })
        .collect()
}
