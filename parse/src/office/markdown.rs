//! The Markdown every Office and EPUB converter writes: ATX headings, `- ` list items (one
//! list per run of items), pipe tables and paragraphs, blocks separated by blank lines.

use super::xml::collapse;

#[derive(Debug, Default)]
pub(crate) struct MarkdownOut {
    text: String,
    /// The last block was a list item: the next item continues the same list.
    in_list: bool,
}

impl MarkdownOut {
    pub(crate) fn heading(&mut self, level: usize, title: &str) {
        let title = collapse(title);
        if title.is_empty() {
            return;
        }
        let level = level.clamp(1, 6);
        self.block(&format!("{} {}", "#".repeat(level), title));
    }

    pub(crate) fn paragraph(&mut self, text: &str) {
        let text = collapse(text);
        if text.is_empty() {
            return;
        }
        self.block(&escape_line_start(&text));
    }

    /// A picture's marker, as a paragraph of its own (see [`super::Pictures`]).
    pub(crate) fn picture(&mut self, marker: &str) {
        self.block(marker);
    }

    /// A bulleted list item at nesting `level` (0 = outermost).
    pub(crate) fn list_item(&mut self, level: usize, text: &str) {
        self.numbered_item(level, None, text);
    }

    /// A list item at nesting `level`: `1. text` with a number, else `- text`.
    pub(crate) fn numbered_item(&mut self, level: usize, number: Option<usize>, text: &str) {
        let text = collapse(text);
        if text.is_empty() {
            return;
        }
        if self.in_list {
            self.text.push('\n');
        } else {
            self.separate();
        }
        self.text.push_str(&"  ".repeat(level.min(8)));
        match number {
            Some(number) => self.text.push_str(&format!("{number}. ")),
            None => self.text.push_str("- "),
        }
        self.text.push_str(&text);
        self.in_list = true;
    }

    /// A table, its first row the header. Rows are padded to the widest.
    pub(crate) fn table(&mut self, rows: &[Vec<String>]) {
        let table = markdown_table(rows);
        if !table.is_empty() {
            self.block(&table);
        }
    }

    pub(crate) fn finish(self) -> String {
        self.text
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.text.len()
    }

    fn block(&mut self, block: &str) {
        self.separate();
        self.text.push_str(block);
        self.in_list = false;
    }

    fn separate(&mut self) {
        if !self.text.is_empty() {
            self.text.push_str("\n\n");
        }
    }
}

/// A pipe table of `rows` (the first is the header), or `""` when every cell is empty.
pub(crate) fn markdown_table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| table_cell(cell)).collect::<Vec<_>>())
        .filter(|row: &Vec<String>| row.iter().any(|cell| !cell.is_empty()))
        .collect();
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    if width == 0 {
        return String::new();
    }
    let line = |row: &[String]| {
        let mut line = String::from("|");
        for column in 0..width {
            line.push(' ');
            line.push_str(row.get(column).map_or("", String::as_str));
            line.push_str(" |");
        }
        line
    };
    let mut out = vec![line(&rows[0])];
    out.push(format!("|{}", " --- |".repeat(width)));
    out.extend(rows[1..].iter().map(|row| line(row)));
    out.join("\n")
}

fn table_cell(text: &str) -> String {
    collapse(text).replace('|', "\\|")
}

/// A paragraph that would read as a heading, table or quote marker gets a backslash.
fn escape_line_start(text: &str) -> String {
    if text.starts_with(['#', '|', '>']) {
        format!("\\{text}")
    } else {
        text.to_string()
    }
}
