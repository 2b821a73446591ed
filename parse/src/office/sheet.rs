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
use super::xml::{Node, XmlWalker, collapse};
use super::zip_kind_mismatch;
use crate::parse::{ParseError, SourceFormat, clean_extracted, decode_text_borrowed};

/// Returns the workbook's title (none: spreadsheets rarely have a useful one) and Markdown.
pub(crate) fn workbook_to_markdown(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
) -> Result<(Option<String>, String), ParseError> {
    let mut records = Records::new(limits, None);
    read_workbook(bytes, format, limits, &mut records)?;
    Ok((None, records.finish()))
}

/// A run of a spreadsheet's records, handed on while the file is still being read
/// ([`stream_records`]).
#[derive(Debug)]
pub struct RecordRun<'a> {
    /// The sheet's name as a heading path (empty for a CSV file or a sheet without a name).
    pub heading_path: &'a [String],
    /// Markdown paragraphs, one per row (`Row 7: Item: Laptop; Cost: 1200`).
    pub text: &'a str,
    /// Char offset of `text` in the Markdown the whole-file parse makes of the same file.
    pub start_char: u64,
    /// The share of the file read so far, from 0 to 1.
    pub read: f64,
}

/// What [`stream_records`] hands each run to; an error stops the reading and is returned.
pub type RecordSink<'s> = dyn FnMut(RecordRun<'_>) -> Result<(), ParseError> + 's;

/// The reading behind [`super::stream_records`], the file's content already checked.
pub(crate) fn stream_records(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
    run_bytes: usize,
    sink: &mut RecordSink<'_>,
) -> Result<(), ParseError> {
    let runs = Runs {
        sink,
        run_bytes: run_bytes.max(1),
        path: Vec::new(),
        chars: 0,
    };
    let mut records = Records::new(limits, Some(runs));
    match format {
        SourceFormat::Csv => read_csv(bytes, &mut records).map(|_| ()),
        _ => read_workbook(bytes, format, limits, &mut records),
    }
}

/// Feeds every cell of a workbook to `records`, sheet by sheet.
fn read_workbook(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
    records: &mut Records<'_, '_>,
) -> Result<(), ParseError> {
    match format {
        SourceFormat::Xlsx => {
            let mut container = Container::open(bytes, limits)?;
            if !container.has("xl/workbook.xml") {
                return Err(zip_kind_mismatch(&container, format));
            }
            // calamine reads the archive itself: every entry must inflate within the budget.
            container.check_every_entry()?;
            let mut workbook = Xlsx::new(Cursor::new(bytes)).map_err(invalid)?;
            let names = workbook.sheet_names();
            let sheets = names.len().max(1) as f64;
            for (index, name) in names.iter().enumerate() {
                records.start_sheet(name)?;
                let mut cells = workbook.worksheet_cells_reader(name).map_err(invalid)?;
                let dimensions = cells.dimensions();
                let height = f64::from(dimensions.end.0.saturating_sub(dimensions.start.0) + 1);
                while let Some(cell) = cells.next_cell().map_err(invalid)? {
                    let (row, column) = cell.get_position();
                    let value = Data::from(cell.get_value().clone());
                    let within = f64::from(row.saturating_sub(dimensions.start.0)) / height;
                    records.read = (index as f64 + within.min(1.0)) / sheets;
                    records.cell(row, column, &value)?;
                }
                records.end_sheet()?;
            }
        }
        SourceFormat::Ods => {
            let mut container = Container::open(bytes, limits)?;
            let Some(content) = container.read_text("content.xml")? else {
                return Err(zip_kind_mismatch(&container, format));
            };
            check_ods_repeats(&content, limits)?;
            drop(content);
            container.check_every_entry()?;
            let workbook = Ods::new(Cursor::new(bytes)).map_err(invalid)?;
            read_ranges(workbook, records)?;
        }
        SourceFormat::Xls => {
            // An OLE compound file, not a zip: no container caps apply. Its sheets are bounded
            // by the format (65,536 rows by 256 columns), and this runs in a parse worker whose
            // memory is capped (`super::parse_xls`).
            let workbook = Xls::new(Cursor::new(bytes)).map_err(invalid)?;
            read_ranges(workbook, records)?;
        }
        other => {
            return Err(ParseError::UnsupportedType(format!(
                "{} is not a spreadsheet",
                other.as_str()
            )));
        }
    }
    Ok(())
}

/// Reads every sheet of a workbook calamine loads whole.
fn read_ranges<RS, R>(mut workbook: R, records: &mut Records<'_, '_>) -> Result<(), ParseError>
where
    RS: std::io::Read + std::io::Seek,
    R: Reader<RS>,
    R::Error: std::fmt::Display,
{
    let names = workbook.sheet_names();
    let sheets = names.len().max(1) as f64;
    for (index, name) in names.iter().enumerate() {
        let range = workbook.worksheet_range(name).map_err(invalid)?;
        records.start_sheet(name)?;
        let Some((first_row, first_column)) = range.start() else {
            records.end_sheet()?;
            continue;
        };
        let height = range.height().max(1) as f64;
        for (offset, row) in range.rows().enumerate() {
            records.read = (index as f64 + offset as f64 / height) / sheets;
            for (column_offset, value) in row.iter().enumerate() {
                records.cell(
                    first_row + offset as u32,
                    first_column + column_offset as u32,
                    value,
                )?;
            }
        }
        records.end_sheet()?;
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
    let mut records = Records::new(limits, None);
    let encoding = read_csv(bytes, &mut records)?;
    Ok((records.finish(), encoding))
}

/// Feeds every field of a CSV file to `records`; returns the text's encoding.
fn read_csv(bytes: &[u8], records: &mut Records<'_, '_>) -> Result<&'static str, ParseError> {
    let (text, encoding) = decode_text_borrowed(bytes)?;
    let delimiter = sniff_delimiter(&text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(text.as_bytes());
    let length = text.len().max(1) as f64;
    records.start_sheet("")?;
    let mut record = csv::StringRecord::new();
    for row in 0.. {
        let more = reader.read_record(&mut record).map_err(|error| {
            ParseError::InvalidDocument(format!("unreadable CSV at row {}: {error}", row + 1))
        })?;
        if !more {
            break;
        }
        records.read = reader.position().byte() as f64 / length;
        for (column, value) in record.iter().enumerate() {
            records.cell(row, column as u32, &Data::String(value.to_string()))?;
        }
    }
    records.end_sheet()?;
    Ok(encoding)
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

/// Turns cells, given row by row in order, into `Row N: Header: value; ...` paragraphs: one
/// Markdown text, or runs handed to a sink as they fill ([`Runs`]).
struct Records<'a, 's> {
    limits: &'a OfficeLimits,
    out: MarkdownOut,
    rows: usize,
    cells: usize,
    header: Option<Vec<String>>,
    /// No row has followed the header yet.
    header_only: bool,
    /// The row being collected: its 0-based index and `(column, text)` of non-empty cells.
    row: Option<(u32, Vec<(u32, String)>)>,
    /// Streaming: `out` holds the current run only.
    runs: Option<Runs<'s>>,
    /// The share of the file read so far (set by the reader, passed on with each run).
    read: f64,
}

/// Where a streaming [`Records`] hands its runs, and where it stands in the whole Markdown.
struct Runs<'s> {
    sink: &'s mut RecordSink<'s>,
    run_bytes: usize,
    /// The current sheet's heading path.
    path: Vec<String>,
    /// Chars of the whole Markdown written before `out`.
    chars: u64,
}

impl<'a, 's> Records<'a, 's> {
    fn new(limits: &'a OfficeLimits, runs: Option<Runs<'s>>) -> Self {
        Records {
            limits,
            out: MarkdownOut::default(),
            rows: 0,
            cells: 0,
            header: None,
            header_only: false,
            row: None,
            runs,
            read: 0.0,
        }
    }

    fn start_sheet(&mut self, name: &str) -> Result<(), ParseError> {
        self.header = None;
        self.row = None;
        if self.runs.is_none() {
            if !name.trim().is_empty() {
                self.out.heading(1, name);
            }
            return Ok(());
        }
        self.hand_on()?;
        if let Some(runs) = self.runs.as_mut() {
            // What `MarkdownOut::heading` writes, counted, not kept: the runs carry it as
            // their heading path.
            let title = collapse(name);
            if !title.is_empty() {
                runs.chars += separator(runs.chars) + 2 + title.chars().count() as u64;
                runs.path = vec![title];
            } else {
                runs.path = Vec::new();
            }
        }
        Ok(())
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
            self.flush_row()?;
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

    fn end_sheet(&mut self) -> Result<(), ParseError> {
        self.flush_row()?;
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
        self.hand_on()
    }

    fn flush_row(&mut self) -> Result<(), ParseError> {
        let Some((row, cells)) = self.row.take() else {
            return Ok(());
        };
        if cells.is_empty() {
            return Ok(());
        }
        let Some(header) = &self.header else {
            let width = cells.iter().map(|(column, _)| *column as usize + 1).max();
            let mut header = vec![String::new(); width.unwrap_or(0)];
            for (column, text) in cells {
                header[column as usize] = text;
            }
            self.header = Some(header);
            self.header_only = true;
            return Ok(());
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
        match &self.runs {
            Some(runs) if self.out.len() >= runs.run_bytes => self.hand_on(),
            _ => Ok(()),
        }
    }

    /// Streaming: hands the current run to the sink and starts the next.
    fn hand_on(&mut self) -> Result<(), ParseError> {
        let Some(Runs {
            sink, path, chars, ..
        }) = self.runs.as_mut()
        else {
            return Ok(());
        };
        // Cleaned as the whole-file parse cleans its Markdown (control characters dropped).
        let text = clean_extracted(&std::mem::take(&mut self.out).finish());
        if text.trim().is_empty() {
            return Ok(());
        }
        let start_char = *chars + separator(*chars);
        *chars = start_char + text.chars().count() as u64;
        sink(RecordRun {
            heading_path: path,
            text: &text,
            start_char,
            read: self.read.clamp(0.0, 1.0),
        })
    }

    fn finish(self) -> String {
        self.out.finish()
    }
}

/// The blank line `MarkdownOut` writes between blocks, after the first.
fn separator(chars_before: u64) -> u64 {
    if chars_before > 0 { 2 } else { 0 }
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

#[cfg(test)]
mod tests {
    use super::super::stream_records;
    use super::*;
    use crate::parse::{ParseOptions, parse_document};

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../tests/fixtures/office/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
    }

    /// One run as the tests see it: (heading path, text, start char, read).
    type SeenRun = (Vec<String>, String, u64, f64);

    /// Every run of `bytes` read with `run_bytes`.
    fn runs(
        bytes: &[u8],
        format: SourceFormat,
        limits: &OfficeLimits,
        run_bytes: usize,
    ) -> Result<Vec<SeenRun>, ParseError> {
        let mut runs = Vec::new();
        stream_records(bytes, format, limits, run_bytes, &mut |run| {
            runs.push((
                run.heading_path.to_vec(),
                run.text.to_string(),
                run.start_char,
                run.read,
            ));
            Ok(())
        })?;
        Ok(runs)
    }

    fn rows(count: usize) -> Vec<u8> {
        let mut csv = String::from("id,name,note\n");
        for row in 0..count {
            csv.push_str(&format!("{row},item {row},\"a note, with a comma\"\n"));
        }
        csv.into_bytes()
    }

    #[test]
    fn runs_are_the_whole_file_markdown_piece_by_piece_under_their_sheet() {
        let limits = OfficeLimits::default();
        let large = rows(5_000);
        for (name, bytes) in [
            ("inventory.xlsx", fixture("inventory.xlsx")),
            ("inventory.ods", fixture("inventory.ods")),
            ("people.csv", fixture("people.csv")),
            ("large.csv", large.clone()),
        ] {
            let format = SourceFormat::from_file_name(name).unwrap();
            let whole = parse_document(&bytes, format, &ParseOptions::default())
                .unwrap()
                .text;
            let whole_chars: Vec<char> = whole.chars().collect();
            for run_bytes in [1, 100, 64 * 1024] {
                let runs = runs(&bytes, format, &limits, run_bytes).unwrap();
                let mut rows_seen = 0;
                let mut last_end = 0;
                let mut last_read = 0.0;
                for (path, text, start, read) in &runs {
                    // The run is the whole Markdown's text at its offset.
                    let start = *start as usize;
                    let length = text.chars().count();
                    let at: String = whole_chars[start..start + length].iter().collect();
                    assert_eq!(&at, text, "{name}, runs of {run_bytes}");
                    assert!(start >= last_end, "{name}: runs in order");
                    last_end = start + length;
                    // Its heading path is the sheet heading above it.
                    let before: String = whole_chars[..start].iter().collect();
                    let heading = before
                        .lines()
                        .rev()
                        .find_map(|line| line.strip_prefix("# "))
                        .map(|title| vec![title.to_string()])
                        .unwrap_or_default();
                    assert_eq!(path, &heading, "{name}");
                    assert!(*read >= last_read && *read <= 1.0, "{name}: {read}");
                    last_read = *read;
                    rows_seen += text.matches("Row ").count();
                }
                assert_eq!(rows_seen, whole.matches("Row ").count(), "{name}");
                assert!(last_end <= whole_chars.len());
                if run_bytes == 1 {
                    assert_eq!(
                        runs.len(),
                        whole.matches("Row ").count(),
                        "{name}: a run a row"
                    );
                }
            }
        }
        // Runs of 64 KiB: the 5,000 rows come in a few runs, not one.
        let count = runs(&large, SourceFormat::Csv, &limits, 64 * 1024)
            .unwrap()
            .len();
        assert!((2..10).contains(&count), "{count} runs");
    }

    #[test]
    fn a_limit_passed_half_way_stops_the_runs_with_its_error() {
        let limits = OfficeLimits {
            max_rows: 1_000,
            ..OfficeLimits::default()
        };
        let mut handed = 0;
        let error = stream_records(&rows(5_000), SourceFormat::Csv, &limits, 1024, &mut |_| {
            handed += 1;
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(error, ParseError::DocumentTooLarge(_)), "{error}");
        assert!(handed > 0, "runs before the limit were handed on");

        // The sink's own error stops the reading at once and comes back.
        let mut handed = 0;
        let error = stream_records(
            &rows(5_000),
            SourceFormat::Csv,
            &OfficeLimits::default(),
            1024,
            &mut |_| {
                handed += 1;
                Err(ParseError::InvalidDocument("stop".into()))
            },
        )
        .unwrap_err();
        assert_eq!(handed, 1);
        assert!(matches!(error, ParseError::InvalidDocument(ref m) if m == "stop"));

        // Nothing to read is `empty`, as for the whole-file parse; other formats are refused.
        let empty = stream_records(b"id,name\n", SourceFormat::Csv, &limits, 1024, &mut |_| {
            Ok(())
        });
        assert!(empty.is_ok(), "a header alone says what the file holds");
        let blank = stream_records(b"\n\n", SourceFormat::Csv, &limits, 1024, &mut |_| Ok(()));
        assert!(matches!(blank, Err(ParseError::Empty)), "{blank:?}");
        let docx = stream_records(
            &fixture("report.docx"),
            SourceFormat::Docx,
            &limits,
            1024,
            &mut |_| Ok(()),
        );
        assert!(
            matches!(docx, Err(ParseError::UnsupportedType(_))),
            "{docx:?}"
        );
        let lying = stream_records(
            &fixture("report.docx"),
            SourceFormat::Xlsx,
            &limits,
            1024,
            &mut |_| Ok(()),
        );
        assert!(
            matches!(lying, Err(ParseError::ContentMismatch { .. })),
            "{lying:?}"
        );
    }
}
