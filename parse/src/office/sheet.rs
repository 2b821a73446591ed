//! Spreadsheets (`.xlsx`, `.xls`, `.ods` through calamine; `.csv`) -> Markdown records.
//!
//! Each sheet becomes `# <sheet name>` followed by one paragraph per row:
//! `Row 7: Item: Laptop; Cost: 1200; Owner: Ana`. The header is the sheet's first non-empty
//! row; a column without a header is named by its letter (`Column C`); empty cells are left
//! out. A record per row, rather than a Markdown table, because every chunk the chunker cuts
//! then carries its column names with each value (a table cut into chunks loses its header
//! after the first, and one never split would be one huge chunk), and the row number tells a
//! reader where to look (ADR 0026).
//!
//! Limits: [`OfficeLimits::max_rows`] and [`OfficeLimits::max_cells`] over all sheets
//! (`document_too_large`). An `.xlsx` sheet is streamed cell by cell, so a million-row sheet
//! stops at the cap without being held in memory; `.ods` content is checked for repeat counts
//! that would expand past the cell cap before calamine expands them; `.xls` sheets are bounded
//! by the format itself (65,536 rows by 256 columns).

use std::io::Cursor;

use calamine::{Data, Ods, Reader, Xls, Xlsx};

use super::OfficeLimits;
use super::container::Container;
use super::markdown::MarkdownOut;
use super::xml::{Node, XmlWalker};
use super::zip_kind_mismatch;
use crate::parse::{ParseError, SourceFormat, decode_text};

/// Returns the workbook's title (none: spreadsheets rarely have a useful one) and Markdown.
pub(crate) fn workbook_to_markdown(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
) -> Result<(Option<String>, String), ParseError> {
    let mut records = Records::new(limits);
    match format {
        SourceFormat::Xlsx => {
            let mut container = Container::open(bytes, limits)?;
            if !container.has("xl/workbook.xml") {
                return Err(zip_kind_mismatch(&container, format));
            }
            // calamine reads the archive itself: every entry must inflate within the budget.
            container.check_every_entry()?;
            let mut workbook = Xlsx::new(Cursor::new(bytes)).map_err(invalid)?;
            for name in workbook.sheet_names() {
                records.start_sheet(&name);
                let mut cells = workbook.worksheet_cells_reader(&name).map_err(invalid)?;
                while let Some(cell) = cells.next_cell().map_err(invalid)? {
                    let (row, column) = cell.get_position();
                    let value = Data::from(cell.get_value().clone());
                    records.cell(row, column, &value)?;
                }
                records.end_sheet();
            }
        }
        SourceFormat::Ods => {
            let mut container = Container::open(bytes, limits)?;
            let Some(content) = container.read_text("content.xml")? else {
                return Err(zip_kind_mismatch(&container, format));
            };
            check_ods_repeats(&content, limits)?;
            container.check_every_entry()?;
            let workbook = Ods::new(Cursor::new(bytes)).map_err(invalid)?;
            read_ranges(workbook, &mut records)?;
        }
        SourceFormat::Xls => {
            // An OLE compound file, not a zip: no container caps apply. Its sheets are bounded
            // by the format (65,536 rows by 256 columns), and this runs in a parse worker whose
            // memory is capped (`super::parse_xls`).
            let workbook = Xls::new(Cursor::new(bytes)).map_err(invalid)?;
            read_ranges(workbook, &mut records)?;
        }
        other => {
            return Err(ParseError::UnsupportedType(format!(
                "{} is not a spreadsheet",
                other.as_str()
            )));
        }
    }
    Ok((None, records.finish()))
}

/// Reads every sheet of a workbook calamine loads whole.
fn read_ranges<RS, R>(mut workbook: R, records: &mut Records) -> Result<(), ParseError>
where
    RS: std::io::Read + std::io::Seek,
    R: Reader<RS>,
    R::Error: std::fmt::Display,
{
    for name in workbook.sheet_names() {
        let range = workbook.worksheet_range(&name).map_err(invalid)?;
        records.start_sheet(&name);
        let Some((first_row, first_column)) = range.start() else {
            records.end_sheet();
            continue;
        };
        for (offset, row) in range.rows().enumerate() {
            for (column_offset, value) in row.iter().enumerate() {
                records.cell(
                    first_row + offset as u32,
                    first_column + column_offset as u32,
                    value,
                )?;
            }
        }
        records.end_sheet();
    }
    Ok(())
}

fn invalid(error: impl std::fmt::Display) -> ParseError {
    ParseError::InvalidDocument(format!("unreadable spreadsheet: {error}"))
}

/// Refuses ODS content whose repeat counts (`table:number-rows-repeated`,
/// `table:number-columns-repeated`) would make calamine expand more non-empty cells than the
/// cell cap allows. Empty repeated cells and rows (LibreOffice pads every sheet with them)
/// cost nothing there and are not counted.
pub(crate) fn check_ods_repeats(content: &str, limits: &OfficeLimits) -> Result<(), ParseError> {
    let mut walker = XmlWalker::new(content, "content.xml");
    let mut total: u128 = 0;
    let mut row_repeats: u128 = 1;
    let mut row_cells: u128 = 0;
    let mut cell_repeats: u128 = 0;
    let mut cell_has_value = false;
    let too_large = || {
        ParseError::DocumentTooLarge(format!(
            "the spreadsheet expands to more than {} cells",
            limits.max_cells
        ))
    };
    while let Some(node) = walker.next_node()? {
        match &node {
            node if node.is_open("table-row") => {
                row_repeats = repeat_count(node.attribute("number-rows-repeated"));
                row_cells = 0;
            }
            node if node.is_open("table-cell") || node.is_open("covered-table-cell") => {
                cell_repeats = repeat_count(node.attribute("number-columns-repeated"));
                cell_has_value = node.attribute("value-type").is_some();
            }
            Node::Text(text) if !text.trim().is_empty() => cell_has_value = true,
            node if node.is_close("table-cell") || node.is_close("covered-table-cell") => {
                if cell_has_value {
                    row_cells += cell_repeats;
                }
                cell_has_value = false;
            }
            node if node.is_close("table-row") => {
                total = total.saturating_add(row_repeats.saturating_mul(row_cells));
                if total > limits.max_cells as u128 {
                    return Err(too_large());
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn repeat_count(value: Option<&str>) -> u128 {
    value.and_then(|value| value.parse().ok()).unwrap_or(1)
}

/// Converts `.csv` (or tab- or semicolon-separated) text; returns the Markdown and the text's
/// encoding.
pub(crate) fn csv_to_markdown(
    bytes: &[u8],
    limits: &OfficeLimits,
) -> Result<(String, &'static str), ParseError> {
    let (text, encoding) = decode_text(bytes)?;
    let delimiter = sniff_delimiter(&text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(text.as_bytes());
    let mut records = Records::new(limits);
    records.start_sheet("");
    for (row, record) in reader.records().enumerate() {
        let record = record.map_err(|error| {
            ParseError::InvalidDocument(format!("unreadable CSV at row {}: {error}", row + 1))
        })?;
        for (column, value) in record.iter().enumerate() {
            records.cell(row as u32, column as u32, &Data::String(value.to_string()))?;
        }
    }
    records.end_sheet();
    Ok((records.finish(), encoding))
}

/// The delimiter of the first line: the most frequent of `,`, `;` and tab outside quotes.
fn sniff_delimiter(text: &str) -> u8 {
    let first_line = text
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("");
    let mut counts = [(b',', 0usize), (b';', 0), (b'\t', 0)];
    let mut quoted = false;
    for byte in first_line.bytes() {
        if byte == b'"' {
            quoted = !quoted;
        } else if !quoted && let Some(entry) = counts.iter_mut().find(|(d, _)| *d == byte) {
            entry.1 += 1;
        }
    }
    counts
        .iter()
        .filter(|(_, count)| *count > 0)
        .max_by_key(|(_, count)| *count)
        .map_or(b',', |(delimiter, _)| *delimiter)
}

/// Turns cells, given row by row in order, into `Row N: Header: value; ...` paragraphs.
struct Records<'a> {
    limits: &'a OfficeLimits,
    out: MarkdownOut,
    rows: usize,
    cells: usize,
    header: Option<Vec<String>>,
    /// No row has followed the header yet.
    header_only: bool,
    /// The row being collected: its 0-based index and `(column, text)` of non-empty cells.
    row: Option<(u32, Vec<(u32, String)>)>,
}

impl<'a> Records<'a> {
    fn new(limits: &'a OfficeLimits) -> Self {
        Records {
            limits,
            out: MarkdownOut::default(),
            rows: 0,
            cells: 0,
            header: None,
            header_only: false,
            row: None,
        }
    }

    fn start_sheet(&mut self, name: &str) {
        self.header = None;
        self.row = None;
        if !name.trim().is_empty() {
            self.out.heading(1, name);
        }
    }

    fn cell(&mut self, row: u32, column: u32, value: &Data) -> Result<(), ParseError> {
        let text = cell_text(value);
        if text.is_empty() {
            return Ok(());
        }
        if self
            .row
            .as_ref()
            .is_some_and(|(current, _)| *current != row)
        {
            self.flush_row();
        }
        let current = self.row.get_or_insert_with(|| (row, Vec::new()));
        if current.1.is_empty() {
            self.rows += 1;
            if self.rows > self.limits.max_rows {
                return Err(ParseError::DocumentTooLarge(format!(
                    "the spreadsheet has more than {} rows",
                    self.limits.max_rows
                )));
            }
        }
        self.cells += 1;
        if self.cells > self.limits.max_cells {
            return Err(ParseError::DocumentTooLarge(format!(
                "the spreadsheet has more than {} cells",
                self.limits.max_cells
            )));
        }
        current.1.push((column, text));
        Ok(())
    }

    fn end_sheet(&mut self) {
        self.flush_row();
        if let Some(header) = self.header.take() {
            // A sheet with a header and no rows still says what it holds.
            if !header.is_empty() && self.header_only {
                self.out.paragraph(&format!(
                    "Columns: {}",
                    header
                        .iter()
                        .filter(|name| !name.is_empty())
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }

    fn flush_row(&mut self) {
        let Some((row, cells)) = self.row.take() else {
            return;
        };
        if cells.is_empty() {
            return;
        }
        let Some(header) = &self.header else {
            let width = cells.iter().map(|(column, _)| *column as usize + 1).max();
            let mut header = vec![String::new(); width.unwrap_or(0)];
            for (column, text) in cells {
                header[column as usize] = text;
            }
            self.header = Some(header);
            self.header_only = true;
            return;
        };
        self.header_only = false;
        let fields: Vec<String> = cells
            .iter()
            .map(|(column, text)| {
                let name = header
                    .get(*column as usize)
                    .filter(|name| !name.is_empty())
                    .cloned()
                    .unwrap_or_else(|| format!("Column {}", column_letters(*column)));
                format!("{name}: {text}")
            })
            .collect();
        self.out
            .paragraph(&format!("Row {}: {}", row + 1, fields.join("; ")));
    }

    fn finish(self) -> String {
        self.out.finish()
    }
}

/// A cell as text: whole numbers without a fraction, dates as ISO dates, newlines as spaces.
fn cell_text(value: &Data) -> String {
    let text = match value {
        Data::Empty => return String::new(),
        Data::Float(number) if number.fract() == 0.0 && number.abs() < 1e15 => {
            format!("{}", *number as i64)
        }
        Data::DateTime(date) if date.is_datetime() => {
            let (year, month, day, hour, minute, second, _) = date.to_ymd_hms_milli();
            if (hour, minute, second) == (0, 0, 0) {
                format!("{year:04}-{month:02}-{day:02}")
            } else {
                format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}")
            }
        }
        other => other.to_string(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `0` -> `A`, `27` -> `AB`.
fn column_letters(column: u32) -> String {
    let mut letters = Vec::new();
    let mut n = column as u64 + 1;
    while n > 0 {
        let rem = ((n - 1) % 26) as u8;
        letters.push(b'A' + rem);
        n = (n - 1) / 26;
    }
    letters.reverse();
    String::from_utf8(letters).unwrap_or_default()
}
