//! Unit tests of the Office and EPUB converters, against the fixtures of
//! `tests/fixtures/office/` (made by its `make.py`) and archives built here.

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use zip::write::SimpleFileOptions;

use super::*;
use crate::chunk::{ChunkerConfig, chunk_document, chunk_markdown_pages};
use crate::parse::{ParseOptions, parse_document};

/// A fixture of `tests/fixtures/office/`.
fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../tests/fixtures/office/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn parse(name: &str) -> Result<ParsedDocument, ParseError> {
    let format = SourceFormat::from_file_name(name).expect("a supported extension");
    parse_document(&fixture(name), format, &ParseOptions::default())
}

fn parse_as(bytes: &[u8], format: SourceFormat) -> Result<ParsedDocument, ParseError> {
    parse_document(bytes, format, &ParseOptions::default())
}

fn parse_limited(
    bytes: &[u8],
    format: SourceFormat,
    limits: OfficeLimits,
) -> Result<ParsedDocument, ParseError> {
    let options = ParseOptions {
        office: limits,
        ..ParseOptions::default()
    };
    parse_document(bytes, format, &options)
}

/// A zip of `entries`, deflated.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, content) in entries {
        writer.start_file(*name, options).unwrap();
        writer.write_all(content).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

/// A zip of `entries` plus `big_name`: `big_size` bytes of `fill` (a zip bomb when large).
fn zip_with_big_entry(
    entries: &[(&str, &[u8])],
    big_name: &str,
    big_size: usize,
    fill: u8,
) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(9))
        .large_file(big_size >= u32::MAX as usize);
    for (name, content) in entries {
        writer.start_file(*name, options).unwrap();
        writer.write_all(content).unwrap();
    }
    writer.start_file(big_name, options).unwrap();
    let block = vec![fill; 1024 * 1024];
    let mut left = big_size;
    while left > 0 {
        let step = left.min(block.len());
        writer.write_all(&block[..step]).unwrap();
        left -= step;
    }
    writer.finish().unwrap().into_inner()
}

fn child_with<'a>(
    chunked: &'a crate::chunk::Chunked,
    needle: &str,
) -> &'a crate::chunk::ChildDraft {
    chunked
        .children
        .iter()
        .find(|child| child.body.contains(needle))
        .unwrap_or_else(|| panic!("no chunk holds {needle:?}: {chunked:#?}"))
}

const REPORT_MARKDOWN: &str = "\
# Orchard Cooperative Report

# Harvest

The cooperative picked 412 tonnes of Bramley apples this autumn.

Comment (Mira): Check the tonnage against the weighbridge log.

## Varieties

- Bramley for baking
- Cox's Orange Pippin for eating
  - Egremont Russet, a late keeper
1. Prune the old trees in February
2. Spray against scab in April

| Variety | Tonnes | Orchard |
| --- | --- | --- |
| Bramley | 250 | North Field |
| Cox | 162 | River Meadow |

# Finances

Cider sales paid for the new cold store by the mill pond.";

#[test]
fn docx_keeps_heading_styles_lists_tables_and_comments() {
    let document = parse("report.docx").unwrap();
    assert_eq!(document.text, REPORT_MARKDOWN);
    assert!(document.markdown);
    assert_eq!(document.encoding, "DOCX");
    assert_eq!(
        document.title.as_deref(),
        Some("Orchard Cooperative Report")
    );
    assert!(document.pages.is_empty());
}

#[test]
fn docx_headings_become_the_heading_path_and_its_table_stays_whole() {
    let document = parse("report.docx").unwrap();
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(child_with(&chunked, "412 tonnes").heading_path, ["Harvest"]);
    // The comment is indexed under the heading of the paragraph it marks.
    assert_eq!(
        child_with(&chunked, "weighbridge").heading_path,
        ["Harvest"]
    );
    let table = child_with(&chunked, "| Variety |");
    assert_eq!(table.heading_path, ["Harvest", "Varieties"]);
    assert!(
        table.body.contains("| Cox | 162 | River Meadow |"),
        "{}",
        table.body
    );
    assert_eq!(
        child_with(&chunked, "cold store").heading_path,
        ["Finances"]
    );
}

const DECK_MARKDOWN: &str = "\
# Slide 1: Sift Roadmap

Planning meeting in the spring

# Slide 2: Storage Engine

- Replace sled with a log-structured store
  - Compaction runs off the hot path

Speaker notes: Mention the raft snapshot format.

Comment (Lee): Ask Dana for the compaction benchmarks.

# Slide 3: Latency Budget

| Stage | Milliseconds |
| --- | --- |
| Retrieval | 40 |
| Rerank | 25 |

Speaker notes: The rerank budget is the hardest to keep.";

#[test]
fn pptx_gives_each_slide_a_heading_with_its_notes_comments_and_tables() {
    let document = parse("deck.pptx").unwrap();
    assert_eq!(document.text, DECK_MARKDOWN);
    assert_eq!(document.title.as_deref(), Some("Sift Roadmap"));
    assert_eq!(document.encoding, "PPTX");
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(
        child_with(&chunked, "raft snapshot").heading_path,
        ["Slide 2: Storage Engine"]
    );
    assert_eq!(
        child_with(&chunked, "compaction benchmarks").heading_path,
        ["Slide 2: Storage Engine"]
    );
    assert_eq!(
        child_with(&chunked, "| Rerank | 25 |").heading_path,
        ["Slide 3: Latency Budget"]
    );
}

#[test]
fn a_decks_slides_are_its_pages_and_its_chunks_know_them() {
    let document = parse("deck.pptx").unwrap();
    let numbers: Vec<u32> = document.pages.iter().map(|page| page.number).collect();
    assert_eq!(numbers, [1, 2, 3]);
    for page in &document.pages {
        let text = &document.text[page.start..page.end];
        assert!(
            text.starts_with(&format!("# Slide {}", page.number)),
            "{text:?}"
        );
        assert_eq!(text.matches("# Slide ").count(), 1, "{text:?}");
    }
    assert_eq!(document.pages.last().unwrap().end, document.text.len());
    let chunked = chunk_markdown_pages(&document.text, &document.pages, &ChunkerConfig::default());
    let raft = child_with(&chunked, "raft snapshot");
    assert_eq!(raft.pages, Some((2, 2)));
    assert_eq!(raft.heading_path, ["Slide 2: Storage Engine"]);
    let table = child_with(&chunked, "| Rerank | 25 |");
    assert_eq!(table.pages, Some((3, 3)));
    // The table is whole, as Markdown chunking keeps it.
    assert!(table.body.contains("| Stage |"), "{}", table.body);
    assert!(chunked.children.iter().all(|child| child.pages.is_some()));
    // A Word document has no pages.
    assert!(parse("report.docx").unwrap().pages.is_empty());
}

const INVENTORY_MARKDOWN: &str = "\
# Inventory

Row 2: Item: Anchor chain; Quantity: 12; Warehouse: Dock 4; Received: 2026-03-14

Row 3: Item: Lantern glass; Quantity: 40; Warehouse: Loft B; Received: 2026-04-02

# Suppliers

Row 2: Name: Tidewater Forge; Country: Norway";

#[test]
fn spreadsheet_rows_become_records_under_their_sheet_in_every_format() {
    for name in ["inventory.xlsx", "inventory.xls", "inventory.ods"] {
        let document = parse(name).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(document.text, INVENTORY_MARKDOWN, "{name}");
        assert!(document.markdown, "{name}");
    }
    let document = parse("inventory.xlsx").unwrap();
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(
        child_with(&chunked, "Tidewater Forge").heading_path,
        ["Suppliers"]
    );
    assert_eq!(
        child_with(&chunked, "Lantern glass").heading_path,
        ["Inventory"]
    );
}

#[test]
fn csv_rows_become_records_with_quoted_fields_and_any_common_delimiter() {
    let document = parse("people.csv").unwrap();
    assert_eq!(
        document.text,
        "Row 2: name: Ada Lovelace; role: Analyst; city: London\n\n\
         Row 3: name: Hopper, Grace; role: Rear admiral; city: Arlington\n\n\
         Row 4: name: Katherine Johnson; role: Mathematician; city: Hampton"
    );
    assert_eq!(document.encoding, "UTF-8");
    let semicolons = parse_as(b"a;b\n1,5;2\n", SourceFormat::Csv).unwrap();
    assert_eq!(semicolons.text, "Row 2: a: 1,5; b: 2");
    let tabs = parse_as(b"a\tb\n1\t\n\t3\n", SourceFormat::Csv).unwrap();
    assert_eq!(tabs.text, "Row 2: a: 1\n\nRow 3: b: 3");
    // A column without a header is named by its letter; a header alone says what it holds.
    let extra = parse_as(b"a,,c\n1,2,3,4\n", SourceFormat::Csv).unwrap();
    assert_eq!(extra.text, "Row 2: a: 1; Column B: 2; c: 3; Column D: 4");
    let header_only = parse_as(b"name,role\n", SourceFormat::Csv).unwrap();
    assert_eq!(header_only.text, "Columns: name, role");
    assert!(matches!(
        parse_as(b"\x00\x01\x02binary\x00", SourceFormat::Csv),
        Err(ParseError::Binary)
    ));
}

#[test]
fn epub_chapters_come_in_spine_order_with_toc_labels_for_headless_chapters() {
    let document = parse("book.epub").unwrap();
    assert_eq!(document.title.as_deref(), Some("Keepers of the Light"));
    assert_eq!(
        document.text,
        "# The Keeper\n\n\
         Elspeth trimmed the wick of the great lamp at dusk & again at midnight.\n\n\
         - Polish the lens\n- Wind the clockwork\n\n\
         # Chapter Two: Ledger of Storms\n\n\
         The ledger recorded every gale that struck the skerry.\n\n\
         | Year | Gales |\n| --- | --- |\n| 1881 | 17 |\n| 1882 | 9 |"
    );
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(
        child_with(&chunked, "| 1881 | 17 |").heading_path,
        ["Chapter Two: Ledger of Storms"]
    );
}

#[test]
fn names_and_media_types_map_to_the_new_formats() {
    for (name, format) in [
        ("a.DOCX", SourceFormat::Docx),
        ("a.pptx", SourceFormat::Pptx),
        ("a.xlsx", SourceFormat::Xlsx),
        ("a.xlsm", SourceFormat::Xlsx),
        ("a.xls", SourceFormat::Xls),
        ("a.ods", SourceFormat::Ods),
        ("a.csv", SourceFormat::Csv),
        ("a.tsv", SourceFormat::Csv),
        ("a.epub", SourceFormat::Epub),
    ] {
        assert_eq!(SourceFormat::from_file_name(name), Some(format), "{name}");
        assert_eq!(SourceFormat::from_name(format.as_str()), Some(format));
    }
    for (media_type, format) in [
        (
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            SourceFormat::Docx,
        ),
        (
            "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            SourceFormat::Pptx,
        ),
        (
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            SourceFormat::Xlsx,
        ),
        ("application/vnd.ms-excel", SourceFormat::Xls),
        (
            "application/vnd.oasis.opendocument.spreadsheet",
            SourceFormat::Ods,
        ),
        ("text/csv; charset=utf-8", SourceFormat::Csv),
        ("application/epub+zip", SourceFormat::Epub),
    ] {
        assert_eq!(SourceFormat::from_media_type(media_type), Some(format));
    }
    assert_eq!(SourceFormat::from_file_name("old.doc"), None);
    assert_eq!(SourceFormat::from_file_name("old.ppt"), None);
}

#[test]
fn old_binary_word_and_powerpoint_are_unsupported_by_name() {
    assert_eq!(
        legacy_office_format("Minutes.DOC"),
        Some("a Word 97-2003 document (.doc)")
    );
    assert_eq!(
        legacy_office_format("deck.ppt"),
        Some("a PowerPoint 97-2003 presentation (.ppt)")
    );
    // Excel 97-2003 is read (in a parse worker): not a legacy format refused by name.
    assert_eq!(legacy_office_format("sheet.xls"), None);
    // An OLE compound file renamed to .docx or .pptx.
    let mut ole = OLE_MAGIC.to_vec();
    ole.resize(4096, 0);
    let error = parse_as(&ole, SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "unsupported_type");
    assert!(error.to_string().contains("Word 97-2003"), "{error}");
    let error = parse_as(&ole, SourceFormat::Pptx).unwrap_err();
    assert_eq!(error.code(), "unsupported_type");
    assert!(error.to_string().contains("PowerPoint 97-2003"), "{error}");
}

#[test]
fn content_that_contradicts_the_extension_is_refused_naming_what_it_is() {
    let pdf = b"%PDF-1.7\n1 0 obj << >> endobj\n";
    let error = parse_as(pdf, SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert_eq!(
        error.to_string(),
        "the file is named as DOCX but its content is a PDF"
    );
    let error = parse_as(b"just some notes\n", SourceFormat::Xlsx).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert!(error.to_string().contains("plain text"), "{error}");
    // A real workbook named .docx, a real document named .pptx or .xls.
    let error = parse_as(&fixture("inventory.xlsx"), SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert!(error.to_string().contains("Excel workbook"), "{error}");
    let error = parse_as(&fixture("report.docx"), SourceFormat::Pptx).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert!(error.to_string().contains("Word document"), "{error}");
    let error = parse_as(&fixture("inventory.xls"), SourceFormat::Xlsx).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert!(!error.is_transient());
}

#[test]
fn broken_containers_are_invalid_documents() {
    let error = parse_as(b"PK\x03\x04 not really a zip", SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "invalid_document");
    let broken = zip_of(&[("word/document.xml", b"<w:document><w:body><w:p></w:r>")]);
    let error = parse_as(&broken, SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "invalid_document", "{error}");
    let stranger = zip_of(&[("notes.txt", b"hello")]);
    let error = parse_as(&stranger, SourceFormat::Epub).unwrap_err();
    assert_eq!(error.code(), "invalid_document", "{error}");
    let empty = zip_of(&[(
        "word/document.xml",
        b"<w:document xmlns:w=\"w\"><w:body><w:p/></w:body></w:document>",
    )]);
    assert!(matches!(
        parse_as(&empty, SourceFormat::Docx),
        Err(ParseError::Empty)
    ));
}

const SMALL: OfficeLimits = OfficeLimits {
    max_unpacked_bytes: 1024 * 1024,
    max_entries: 16,
    max_rows: 100,
    max_cells: 1_000,
};

#[test]
fn a_zip_bomb_stops_at_the_unpacked_size_cap() {
    // 8 MiB that deflate to a few KiB, read under a 1 MiB cap.
    let docx = zip_with_big_entry(&[], "word/document.xml", 8 * 1024 * 1024, b' ');
    assert!(docx.len() < 64 * 1024, "{}", docx.len());
    let error = parse_limited(&docx, SourceFormat::Docx, SMALL).unwrap_err();
    assert_eq!(error.code(), "document_too_large");
    assert!(error.to_string().contains("1 MiB"), "{error}");
    // In a workbook the bomb is a part calamine would read itself (or a media file): every
    // entry is inflated under the cap before calamine sees the archive.
    let xlsx = zip_with_big_entry(
        &[("xl/workbook.xml", b"<workbook/>")],
        "xl/media/image1.png",
        8 * 1024 * 1024,
        0,
    );
    let error = parse_limited(&xlsx, SourceFormat::Xlsx, SMALL).unwrap_err();
    assert_eq!(error.code(), "document_too_large");
    let pptx = zip_with_big_entry(&[], "ppt/presentation.xml", 8 * 1024 * 1024, b' ');
    let error = parse_limited(&pptx, SourceFormat::Pptx, SMALL).unwrap_err();
    assert_eq!(error.code(), "document_too_large");
}

#[test]
fn a_zip_bomb_past_the_default_cap_is_refused() {
    // 300 MiB of spaces in 1.9 MiB, past the default 256 MiB cap; as a workbook part too.
    let size = 300 * 1024 * 1024;
    let docx = hand_made_bomb(&[], "word/document.xml", size);
    assert!(docx.len() < 2 * 1024 * 1024, "{}", docx.len());
    let started = Instant::now();
    let error = parse_as(&docx, SourceFormat::Docx).unwrap_err();
    assert_eq!(error.code(), "document_too_large", "{error}");
    assert!(error.to_string().contains("256 MiB"), "{error}");
    eprintln!("bomb refused in {:?}", started.elapsed());
    let xlsx = hand_made_bomb(
        &[("xl/workbook.xml", b"<workbook/>")],
        "xl/worksheets/sheet1.xml",
        size,
    );
    let error = parse_as(&xlsx, SourceFormat::Xlsx).unwrap_err();
    assert_eq!(error.code(), "document_too_large", "{error}");
}

/// A zip whose `big_name` entry inflates to about `size` spaces, written without compressing
/// them (the zip crate would take many seconds in a debug build): one fixed-Huffman deflate
/// block of a literal space and 258-byte matches at distance 1, 13 bits each. The other
/// entries are stored. The big entry's CRC is left zero: a reader under a cap never gets to it.
fn hand_made_bomb(entries: &[(&str, &[u8])], big_name: &str, size: usize) -> Vec<u8> {
    struct Bits {
        bytes: Vec<u8>,
        used: u32,
    }
    impl Bits {
        fn push(&mut self, value: u32, count: u32, msb_first: bool) {
            for i in 0..count {
                let bit = if msb_first {
                    (value >> (count - 1 - i)) & 1
                } else {
                    (value >> i) & 1
                };
                if self.used.is_multiple_of(8) {
                    self.bytes.push(0);
                }
                if bit == 1 {
                    *self.bytes.last_mut().unwrap() |= 1 << (self.used % 8);
                }
                self.used += 1;
            }
        }
    }
    let matches = (size - 1) / 258;
    let mut bits = Bits {
        bytes: Vec::with_capacity(matches * 13 / 8 + 16),
        used: 0,
    };
    bits.push(1, 1, false); // BFINAL
    bits.push(1, 2, false); // BTYPE 01: fixed Huffman codes
    bits.push(0x30 + u32::from(b' '), 8, true); // the literal
    for _ in 0..matches {
        bits.push(0xC5, 8, true); // length 258 (symbol 285)
        bits.push(0, 5, true); // distance 1
    }
    bits.push(0, 7, true); // end of block
    let inflated = (1 + matches * 258) as u32;

    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut add = |out: &mut Vec<u8>, name: &str, method: u16, crc: u32, data: &[u8], size: u32| {
        let offset = out.len() as u32;
        let header = |signature: u32, central: bool| {
            let mut header = Vec::new();
            header.extend(signature.to_le_bytes());
            if central {
                header.extend(20u16.to_le_bytes()); // made by
            }
            header.extend(20u16.to_le_bytes()); // needed
            header.extend(0u16.to_le_bytes()); // flags
            header.extend(method.to_le_bytes());
            header.extend(0u16.to_le_bytes()); // time
            header.extend(0x21u16.to_le_bytes()); // date: 1980-01-01
            header.extend(crc.to_le_bytes());
            header.extend((data.len() as u32).to_le_bytes());
            header.extend(size.to_le_bytes());
            header.extend((name.len() as u16).to_le_bytes());
            header.extend(0u16.to_le_bytes()); // extra
            if central {
                header.extend([0u8; 8]); // comment, disk, internal and external attributes
                header.extend([0u8; 2]);
                header.extend(offset.to_le_bytes());
            }
            header.extend(name.as_bytes());
            header
        };
        out.extend(header(0x0403_4b50, false));
        out.extend(data);
        central.extend(header(0x0201_4b50, true));
    };
    for (name, data) in entries {
        add(
            &mut out,
            name,
            0,
            crc32fast::hash(data),
            data,
            data.len() as u32,
        );
    }
    add(&mut out, big_name, 8, 0, &bits.bytes, inflated);
    let central_offset = out.len() as u32;
    let count = (entries.len() + 1) as u16;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]); // disk numbers
    out.extend(count.to_le_bytes());
    out.extend(count.to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(central_offset.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

#[test]
fn a_hand_made_zip_reads_as_the_bytes_it_stands_for() {
    let small = hand_made_bomb(&[("a.txt", b"hello")], "b.txt", 1 + 258 * 4);
    let mut container = container::Container::open(&small, &OfficeLimits::default()).unwrap();
    assert_eq!(container.read("a.txt").unwrap().unwrap(), b"hello");
    // The big entry's missing CRC is only noticed at its end.
    assert!(container.read("b.txt").is_err());
    let mut capped = container::Container::open(&small, &SMALL_1K).unwrap();
    assert_eq!(
        capped.read("b.txt").unwrap_err().code(),
        "document_too_large"
    );
}

const SMALL_1K: OfficeLimits = OfficeLimits {
    max_unpacked_bytes: 1024,
    max_entries: 16,
    max_rows: 100,
    max_cells: 1_000,
};

#[test]
fn too_many_zip_entries_are_refused() {
    let names: Vec<String> = (0..20).map(|i| format!("word/media/{i}.bin")).collect();
    let entries: Vec<(&str, &[u8])> = names
        .iter()
        .map(|name| (name.as_str(), &b"x"[..]))
        .collect();
    let docx = zip_of(&entries);
    let error = parse_limited(&docx, SourceFormat::Docx, SMALL).unwrap_err();
    assert_eq!(error.code(), "document_too_large");
    assert!(error.to_string().contains("20 entries"), "{error}");
}

/// A minimal workbook with one sheet of `rows` rows, each a number and a string.
fn workbook_with_rows(rows: usize) -> Vec<u8> {
    let mut sheet = String::with_capacity(rows * 64);
    sheet.push_str(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><worksheet \
         xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\"><sheetData>",
    );
    sheet.push_str("<row r=\"1\"><c r=\"A1\" t=\"inlineStr\"><is><t>n</t></is></c></row>");
    for row in 2..=rows {
        sheet.push_str(&format!(
            "<row r=\"{row}\"><c r=\"A{row}\"><v>{row}</v></c></row>"
        ));
    }
    sheet.push_str("</sheetData></worksheet>");
    zip_of(&[
        (
            "[Content_Types].xml",
            b"<?xml version=\"1.0\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\">\
<Default Extension=\"xml\" ContentType=\"application/xml\"/>\
<Default Extension=\"rels\" ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/>\
<Override PartName=\"/xl/workbook.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml\"/>\
<Override PartName=\"/xl/worksheets/sheet1.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml\"/>\
</Types>",
        ),
        (
            "_rels/.rels",
            b"<?xml version=\"1.0\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">\
<Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" Target=\"xl/workbook.xml\"/>\
</Relationships>",
        ),
        (
            "xl/workbook.xml",
            b"<?xml version=\"1.0\"?><workbook xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\" \
xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\">\
<sheets><sheet name=\"Big\" sheetId=\"1\" r:id=\"rId1\"/></sheets></workbook>",
        ),
        (
            "xl/_rels/workbook.xml.rels",
            b"<?xml version=\"1.0\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">\
<Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet\" Target=\"worksheets/sheet1.xml\"/>\
</Relationships>",
        ),
        ("xl/worksheets/sheet1.xml", sheet.as_bytes()),
    ])
}

#[test]
fn a_small_generated_workbook_reads() {
    let document = parse_as(&workbook_with_rows(3), SourceFormat::Xlsx).unwrap();
    assert_eq!(document.text, "# Big\n\nRow 2: n: 2\n\nRow 3: n: 3");
}

#[test]
fn a_million_row_workbook_stops_at_the_row_cap() {
    let xlsx = workbook_with_rows(1_000_000);
    let started = Instant::now();
    let error = parse_as(&xlsx, SourceFormat::Xlsx).unwrap_err();
    assert_eq!(error.code(), "document_too_large", "{error}");
    assert!(error.to_string().contains("200000 rows"), "{error}");
    eprintln!("million rows refused in {:?}", started.elapsed());
    let error = parse_limited(&workbook_with_rows(500), SourceFormat::Xlsx, SMALL).unwrap_err();
    assert!(error.to_string().contains("100 rows"), "{error}");
    let csv: String = (0..500).map(|row| format!("{row}\n")).collect();
    let error = parse_limited(csv.as_bytes(), SourceFormat::Csv, SMALL).unwrap_err();
    assert_eq!(error.code(), "document_too_large");
}

#[test]
fn ods_repeat_counts_that_would_expand_past_the_cell_cap_are_refused() {
    let content = "<?xml version=\"1.0\"?><office:document-content \
        xmlns:office=\"urn:oasis:names:tc:opendocument:xmlns:office:1.0\" \
        xmlns:table=\"urn:oasis:names:tc:opendocument:xmlns:table:1.0\"><office:body>\
        <office:spreadsheet><table:table table:name=\"Bomb\">\
        <table:table-row table:number-rows-repeated=\"1000000\">\
        <table:table-cell table:number-columns-repeated=\"16000\" office:value-type=\"float\" \
        office:value=\"1\"/></table:table-row>\
        <table:table-row table:number-rows-repeated=\"1048000\"><table:table-cell/></table:table-row>\
        </table:table></office:spreadsheet></office:body></office:document-content>";
    let ods = zip_of(&[
        (
            "mimetype",
            b"application/vnd.oasis.opendocument.spreadsheet",
        ),
        ("content.xml", content.as_bytes()),
    ]);
    let error = parse_as(&ods, SourceFormat::Ods).unwrap_err();
    assert_eq!(error.code(), "document_too_large", "{error}");
    // Empty padding rows, as LibreOffice writes them, cost nothing.
    let padded = content.replace("16000", "1").replace("1000000", "1");
    let ods = zip_of(&[
        (
            "mimetype",
            b"application/vnd.oasis.opendocument.spreadsheet",
        ),
        ("META-INF/manifest.xml", b"<manifest/>"),
        ("content.xml", padded.as_bytes()),
    ]);
    assert!(sheet::check_ods_repeats(&padded, &OfficeLimits::default()).is_ok());
    let document = parse_as(&ods, SourceFormat::Ods).unwrap();
    assert_eq!(document.text, "# Bomb\n\nColumns: 1");
}

#[test]
fn zip_paths_resolve_relative_absolute_and_escaped_targets() {
    use container::resolve;
    assert_eq!(
        resolve("ppt/slides", "../notesSlides/n1.xml"),
        "ppt/notesSlides/n1.xml"
    );
    assert_eq!(resolve("word", "/word/media/a.png"), "word/media/a.png");
    assert_eq!(
        resolve("OEBPS", "text/chapter%202.xhtml#x"),
        "OEBPS/text/chapter 2.xhtml"
    );
    assert_eq!(resolve("", "../../etc/passwd"), "etc/passwd");
}

#[test]
fn damaged_fixtures_fail_with_clean_codes() {
    for name in [
        "report.docx",
        "deck.pptx",
        "inventory.xlsx",
        "inventory.ods",
        "book.epub",
    ] {
        let bytes = fixture(name);
        let format = SourceFormat::from_file_name(name).unwrap();
        let mut damaged: Vec<Vec<u8>> = (1..16)
            .map(|sixteenth| bytes[..bytes.len() * sixteenth / 16].to_vec())
            .collect();
        for step in [7usize, 31, 101, 499] {
            let mut flipped = bytes.clone();
            for index in (8..flipped.len()).step_by(step) {
                flipped[index] ^= 0x5a;
            }
            damaged.push(flipped);
        }
        for (case, bytes) in damaged.iter().enumerate() {
            if let Err(error) = parse_as(bytes, format) {
                assert!(
                    matches!(
                        error.code(),
                        "invalid_document" | "content_mismatch" | "empty_document"
                    ),
                    "{name} case {case}: {error}"
                );
            }
        }
    }
}

#[test]
fn an_excel_97_workbook_reads_and_a_damaged_one_fails_cleanly() {
    // calamine 0.38's OLE reader slices past the end of a truncated file and panics: the
    // document fails, the caller goes on. (The file on which it loops, found by fuzzing, is
    // the parse worker's to stop: `tests/tests/pdf.rs` runs it through a node process.)
    let whole = fixture("inventory.xls");
    let document = parse_as(&whole, SourceFormat::Xls).unwrap();
    assert_eq!(document.encoding, "XLS");
    for sixteenth in 1..16 {
        let truncated = &whole[..whole.len() * sixteenth / 16];
        let error = parse_as(truncated, SourceFormat::Xls).unwrap_err();
        assert!(
            matches!(error.code(), "invalid_document" | "content_mismatch"),
            "{sixteenth}/16: {error}"
        );
    }
    // Not an OLE file at all.
    let error = parse_as(&fixture("inventory.xlsx"), SourceFormat::Xls).unwrap_err();
    assert_eq!(error.code(), "content_mismatch");
    assert!(crate::parse::SUPPORTED_EXTENSIONS.contains(&"xls"));
}

#[test]
fn a_utf16_part_with_its_byte_order_mark_reads() {
    let xml = "<?xml version=\"1.0\" encoding=\"UTF-16\"?><w:document xmlns:w=\"w\"><w:body>\
               <w:p><w:r><w:t>Sixteen-bit café</w:t></w:r></w:p></w:body></w:document>";
    let mut utf16 = vec![0xff, 0xfe];
    for unit in xml.encode_utf16() {
        utf16.extend(unit.to_le_bytes());
    }
    let docx = zip_of(&[("word/document.xml", &utf16)]);
    assert_eq!(
        parse_as(&docx, SourceFormat::Docx).unwrap().text,
        "Sixteen-bit café"
    );
    let latin1 = zip_of(&[("word/document.xml", b"<w:document>caf\xe9</w:document>")]);
    assert_eq!(
        parse_as(&latin1, SourceFormat::Docx).unwrap_err().code(),
        "invalid_document"
    );
}

#[test]
fn merged_table_cells_stand_in_every_grid_cell_they_cover() {
    let cell = |text: &str, properties: &str| {
        format!("<w:tc><w:tcPr>{properties}</w:tcPr><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:tc>")
    };
    let row = |cells: &[String]| format!("<w:tr>{}</w:tr>", cells.concat());
    let table = [
        row(&[cell("Berth", ""), cell("Vessel", ""), cell("Tonnes", "")]),
        row(&[
            cell("North quay", "<w:vMerge w:val=\"restart\"/>"),
            cell("Ardmore", "<w:gridSpan w:val=\"2\"/>"),
        ]),
        row(&[cell("", "<w:vMerge/>"), cell("Skerry", ""), cell("340", "")]),
    ]
    .concat();
    // A span past the cap stops at it.
    let wide = row(&[cell("x", "<w:gridSpan w:val=\"100000\"/>")]);
    let xml = format!(
        "<w:document xmlns:w=\"w\"><w:body><w:tbl>{table}</w:tbl><w:tbl>{wide}</w:tbl>\
         </w:body></w:document>"
    );
    let docx = zip_of(&[("word/document.xml", xml.as_bytes())]);
    let text = parse_as(&docx, SourceFormat::Docx).unwrap().text;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "| Berth | Vessel | Tonnes |", "{text}");
    assert_eq!(lines[2], "| North quay | Ardmore | Ardmore |", "{text}");
    assert_eq!(lines[3], "| North quay | Skerry | 340 |", "{text}");
    assert_eq!(lines[5].matches("| x ").count(), 64, "{text}"); // MAX_CELL_SPAN
}

#[test]
fn a_picture_in_a_word_table_cell_follows_the_table() {
    let notice = std::fs::read(format!(
        "{}/../tests/fixtures/ocr/harbour-notice.png",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let document = "<w:document xmlns:w=\"w\" xmlns:a=\"a\" xmlns:r=\"r\"><w:body>\
        <w:tbl><w:tr><w:tc><w:p><w:r><w:t>Notice board</w:t></w:r></w:p></w:tc>\
        <w:tc><w:p><w:r><w:drawing><a:blip r:embed=\"rId5\"/></w:drawing></w:r></w:p></w:tc>\
        </w:tr></w:tbl><w:p><w:r><w:t>After the table.</w:t></w:r></w:p></w:body></w:document>";
    let relationships = "<Relationships><Relationship Id=\"rId5\" \
        Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/image\" \
        Target=\"media/image1.png\"/></Relationships>";
    let docx = zip_of(&[
        ("word/document.xml", document.as_bytes()),
        ("word/_rels/document.xml.rels", relationships.as_bytes()),
        ("word/media/image1.png", &notice),
    ]);
    let parsed = parse_as(&docx, SourceFormat::Docx).unwrap();
    assert_eq!(parsed.pictures.len(), 1, "{parsed:?}");
    assert_eq!(parsed.pictures[0].bytes, notice);
    let table = parsed.text.find("| Notice board |").expect("the table");
    let marker = parsed
        .text
        .find("\n\n[sift-picture-1]\n\n")
        .expect("the marker paragraph");
    let after = parsed.text.find("After the table.").unwrap();
    assert!(table < marker && marker < after, "{}", parsed.text);
}

#[test]
fn pictures_of_word_and_powerpoint_files_are_kept_for_ocr_in_place() {
    let notice = std::fs::read(format!(
        "{}/../tests/fixtures/ocr/harbour-notice.png",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for (name, before, after) in [
        (
            "pictured.docx",
            "The notice below is posted at the pier head.",
            Some("Ask the harbour master for copies."),
        ),
        ("pictured.pptx", "# Slide 1: Pier head notice", None),
    ] {
        let document = parse(name).unwrap();
        assert_eq!(document.pictures.len(), 1, "{name}: {document:?}");
        let picture = &document.pictures[0];
        assert_eq!(picture.marker, "[sift-picture-1]");
        assert_eq!(picture.media_type, "image/png");
        assert_eq!(
            picture.bytes, notice,
            "{name}: the picture's bytes as stored"
        );
        // The marker is a paragraph of its own, after the text that comes before it.
        let text = &document.text;
        let marker = text
            .find("\n\n[sift-picture-1]")
            .expect("the marker paragraph");
        assert!(text[..marker].contains(before), "{name}: {text}");
        if let Some(after) = after {
            assert!(text[marker..].contains(after), "{name}: {text}");
        }
    }
    // Files without pictures have none and no marker.
    let report = parse("report.docx").unwrap();
    assert!(report.pictures.is_empty() && !report.text.contains("[sift-picture"));
}

/// `bytes`, a zip, with each entry of `changes` replacing the entry of that name or added.
fn rezip(bytes: &[u8], changes: &[(&str, &[u8])]) -> Vec<u8> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).unwrap();
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
        entries.push((entry.name().unwrap().to_string(), content));
    }
    for (name, content) in changes {
        match entries.iter_mut().find(|(existing, _)| existing == name) {
            Some(entry) => entry.1 = content.to_vec(),
            None => entries.push((name.to_string(), content.to_vec())),
        }
    }
    let borrowed: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(name, content)| (name.as_str(), content.as_slice()))
        .collect();
    zip_of(&borrowed)
}

/// The text of entry `name` of the zip `bytes`.
fn entry_text(bytes: &[u8], name: &str) -> String {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut archive.by_name(name).unwrap(), &mut text).unwrap();
    text
}

const FIELD_NOTES_MARKDOWN: &str = "\
# Tidal Survey Field Notes

# Soundings

The launch took soundings along the eastern channel at low water and found the bar had moved north.

Footnote 1: Low water was predicted at 06:42 by the almanac.

The shoal near the breakwater is now two metres shallower than charted.

Comment (Ines): Confirm the bar position with the echo sounder trace.

## Equipment

- Single beam echo sounder
  - Spare transducer cable
- Lead line for checks
1. Calibrate the sounder against the lead line
2. Log every fix with the time

| Station | Depth | Bottom |
| --- | --- | --- |
| Buoy seven | 4.2 | Sand |
| Pier head | 6.8 | Mud and shell |

# Weather

A westerly swell made the afternoon runs unreliable, so they will be repeated.

Endnote 1: Swell height came from the harbour wave buoy.

# Headers and footers

Header: Harbour Authority survey team, internal draft

Footer: Printed for the spring tide review";

#[test]
fn docx_notes_follow_their_paragraph_and_headers_and_footers_close_the_document() {
    // Written by LibreOffice from libreoffice/field-notes.fodt.
    let document = parse("libreoffice/field-notes.docx").unwrap();
    assert_eq!(document.text, FIELD_NOTES_MARKDOWN);
    assert_eq!(document.title.as_deref(), Some("Tidal Survey Field Notes"));
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(child_with(&chunked, "06:42").heading_path, ["Soundings"]);
    assert_eq!(
        child_with(&chunked, "echo sounder trace").heading_path,
        ["Soundings"]
    );
    assert_eq!(child_with(&chunked, "wave buoy").heading_path, ["Weather"]);
    let header = child_with(&chunked, "internal draft");
    assert_eq!(header.heading_path, ["Headers and footers"]);
    assert!(!header.body.contains("westerly swell"), "{}", header.body);
}

#[test]
fn a_header_shared_by_every_section_is_written_once() {
    // Made in Word (python-docx's test files): two sections, the second's header and footer
    // linked to the first's, plus empty first-page and even-page parts.
    let document = parse("upstream/hdr-header-footer.docx").unwrap();
    assert!(
        document.text.ends_with(
            "# Headers and footers\n\nHeader: Header for section-1\n\nFooter: Footer for section 1"
        ),
        "{}",
        document.text
    );
    assert_eq!(document.text.matches("Header for section-1").count(), 1);
    // Comments made in Word, with and without an author, each after its paragraph.
    let document = parse("upstream/comments-rich-para.docx").unwrap();
    assert!(
        document.text.contains(
            "Some text worthy of note.\n\n\
             Comment (Steve Canny): Text with hyperlink https://google.com embedded."
        ),
        "{}",
        document.text
    );
}

/// A `.docx` of `document` (a `w:body`'s content) with the parts of `extra` and their
/// relationships (`(id, type tail, target, content)`).
fn docx_with(body: &str, extra: &[(&str, &str, &str, &str)]) -> Vec<u8> {
    const NS: &str = "xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\" \
        xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\"";
    let document = format!("<w:document {NS}><w:body>{body}</w:body></w:document>");
    let mut rels = String::from(
        "<Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">",
    );
    for (id, kind, target, _) in extra {
        rels.push_str(&format!(
            "<Relationship Id=\"{id}\" Type=\"http://schemas.openxmlformats.org/\
             officeDocument/2006/relationships/{kind}\" Target=\"{target}\"/>"
        ));
    }
    rels.push_str("</Relationships>");
    let parts: Vec<(String, String)> = extra
        .iter()
        .map(|(_, _, target, content)| {
            (
                format!("word/{target}"),
                format!("<w:root {NS}>{content}</w:root>"),
            )
        })
        .collect();
    let mut entries: Vec<(&str, &[u8])> = vec![
        ("word/document.xml", document.as_bytes()),
        ("word/_rels/document.xml.rels", rels.as_bytes()),
    ];
    entries.extend(
        parts
            .iter()
            .map(|(name, content)| (name.as_str(), content.as_bytes())),
    );
    zip_of(&entries)
}

#[test]
fn footnotes_are_numbered_in_reference_order_and_repeated_headers_dedupe_by_text() {
    let body = "\
        <w:p><w:r><w:t>Tides rise twice a day.</w:t></w:r>\
          <w:r><w:footnoteReference w:id=\"7\"/></w:r></w:p>\
        <w:tbl><w:tr><w:tc><w:p><w:r><w:t>Cell</w:t></w:r>\
          <w:r><w:footnoteReference w:id=\"3\"/></w:r></w:p></w:tc></w:tr></w:tbl>\
        <w:p><w:r><w:t>Spring tides follow the moon.</w:t></w:r>\
          <w:r><w:footnoteReference w:customMarkFollows=\"1\" w:id=\"5\"/><w:t>*</w:t></w:r></w:p>\
        <w:p><w:pPr><w:sectPr><w:headerReference w:type=\"default\" r:id=\"h1\"/>\
          <w:footerReference w:type=\"default\" r:id=\"f1\"/></w:sectPr></w:pPr></w:p>\
        <w:sectPr><w:headerReference w:type=\"default\" r:id=\"h2\"/>\
          <w:headerReference w:type=\"first\" r:id=\"h3\"/></w:sectPr>";
    let footnotes = "\
        <w:footnote w:type=\"separator\" w:id=\"-1\"><w:p><w:r><w:separator/></w:r></w:p></w:footnote>\
        <w:footnote w:id=\"3\"><w:p><w:r><w:t>Measured at the pier.</w:t></w:r></w:p></w:footnote>\
        <w:footnote w:id=\"5\"><w:p><w:r><w:t>Marked with a star.</w:t></w:r></w:p></w:footnote>\
        <w:footnote w:id=\"7\"><w:p><w:r><w:footnoteRef/></w:r><w:r><w:t>Roughly.</w:t></w:r></w:p>\
          <w:p><w:r><w:t>See the almanac.</w:t></w:r></w:p></w:footnote>";
    let header = "<w:p><w:r><w:t>Harbour</w:t></w:r><w:r><w:tab/><w:t>log</w:t></w:r></w:p>";
    let bytes = docx_with(
        body,
        &[
            ("n1", "footnotes", "footnotes.xml", footnotes),
            ("h1", "header", "header1.xml", header),
            ("h2", "header", "header2.xml", header),
            ("h3", "header", "header3.xml", "<w:p/>"),
            (
                "f1",
                "footer",
                "footer1.xml",
                "<w:p><w:r><w:t>Page</w:t></w:r></w:p>",
            ),
        ],
    );
    let document = parse_as(&bytes, SourceFormat::Docx).unwrap();
    assert_eq!(
        document.text,
        "Tides rise twice a day.\n\n\
         Footnote 1: Roughly. See the almanac.\n\n\
         | Cell |\n| --- |\n\n\
         Footnote 2: Measured at the pier.\n\n\
         Spring tides follow the moon.*\n\n\
         Footnote: Marked with a star.\n\n\
         # Headers and footers\n\n\
         Header: Harbour log\n\n\
         Footer: Page"
    );
}

#[test]
fn modern_and_old_powerpoint_comments_come_with_their_slide_and_author() {
    let deck = fixture("deck.pptx");
    let slide_rels = entry_text(&deck, "ppt/slides/_rels/slide1.xml.rels").replace(
        "</Relationships>",
        "<Relationship Id=\"rIdM1\" Type=\"http://schemas.microsoft.com/office/2018/10/\
         relationships/comments\" Target=\"../comments/modernComment_100_1.xml\"/>\
         </Relationships>",
    );
    let presentation_rels = entry_text(&deck, "ppt/_rels/presentation.xml.rels").replace(
        "</Relationships>",
        "<Relationship Id=\"rIdM2\" Type=\"http://schemas.microsoft.com/office/2018/10/\
         relationships/authors\" Target=\"authors.xml\"/></Relationships>",
    );
    let p188 = "xmlns:p188=\"http://schemas.microsoft.com/office/powerpoint/2018/8/main\" \
        xmlns:a=\"http://schemas.openxmlformats.org/drawingml/2006/main\"";
    let authors = format!(
        "<p188:authorLst {p188}><p188:author id=\"{{A1}}\" name=\"Noor\" initials=\"N\" \
         userId=\"Noor\" providerId=\"None\"/></p188:authorLst>"
    );
    let comments = format!(
        "<p188:cmLst {p188}><p188:cm id=\"{{C1}}\" authorId=\"{{A1}}\">\
         <p188:replyLst><p188:reply id=\"{{R1}}\" authorId=\"{{A9}}\"><p188:txBody><a:bodyPr/>\
         <a:p><a:r><a:t>Agreed, spring.</a:t></a:r></a:p></p188:txBody></p188:reply>\
         </p188:replyLst><p188:txBody><a:bodyPr/><a:p><a:r><a:t>Is the meeting</a:t></a:r></a:p>\
         <a:p><a:r><a:t>in March?</a:t></a:r></a:p></p188:txBody></p188:cm></p188:cmLst>"
    );
    let bytes = rezip(
        &deck,
        &[
            ("ppt/slides/_rels/slide1.xml.rels", slide_rels.as_bytes()),
            (
                "ppt/_rels/presentation.xml.rels",
                presentation_rels.as_bytes(),
            ),
            ("ppt/authors.xml", authors.as_bytes()),
            ("ppt/comments/modernComment_100_1.xml", comments.as_bytes()),
        ],
    );
    let document = parse_as(&bytes, SourceFormat::Pptx).unwrap();
    assert!(
        document.text.starts_with(
            "# Slide 1: Sift Roadmap\n\nPlanning meeting in the spring\n\n\
             Comment (Noor): Is the meeting in March?\n\n\
             Comment: Agreed, spring.\n\n# Slide 2"
        ),
        "{}",
        document.text
    );
    // The old-style comment of slide 2 keeps its author from commentAuthors.xml.
    assert!(document.text.contains("Comment (Lee): Ask Dana"));
    let chunked = chunk_markdown_pages(&document.text, &document.pages, &ChunkerConfig::default());
    assert_eq!(child_with(&chunked, "in March").pages, Some((1, 1)));
}

#[test]
fn epub_footnotes_in_asides_are_kept() {
    // Written by LibreOffice from libreoffice/field-notes.fodt: its notes are
    // `<aside epub:type="footnote">`, which the HTML converter otherwise drops as chrome.
    let document = parse("libreoffice/field-notes.epub").unwrap();
    let chunked = chunk_document(&document.text, true, &ChunkerConfig::default());
    assert_eq!(child_with(&chunked, "06:42").heading_path, ["Soundings"]);
    assert_eq!(child_with(&chunked, "wave buoy").heading_path, ["Weather"]);
}

/// Lowercase words (runs of letters and digits) of `text`.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The share of `reference`'s words (counted with repeats) that `ours` also holds, and the
/// words it misses.
fn word_recall(reference: &str, ours: &str) -> (f64, Vec<String>) {
    let mut available: HashMap<String, usize> = HashMap::new();
    for word in words(ours) {
        *available.entry(word).or_default() += 1;
    }
    let expected = words(reference);
    let mut missing = Vec::new();
    for word in &expected {
        match available.get_mut(word) {
            Some(count) if *count > 0 => *count -= 1,
            _ => missing.push(word.clone()),
        }
    }
    let found = expected.len() - missing.len();
    (found as f64 / expected.len().max(1) as f64, missing)
}

#[test]
fn fixtures_match_their_reference_extraction() {
    // reference/*.txt are written by tests/fixtures/office/reference.py with python-docx,
    // python-pptx, openpyxl and the standard library (see the folder's README).
    let names = [
        "report.docx",
        "deck.pptx",
        "inventory.xlsx",
        "inventory.ods",
        "book.epub",
        "libreoffice/field-notes.docx",
        "libreoffice/ferry-review.pptx",
        "libreoffice/harbour-dues.xlsx",
        "libreoffice/harbour-dues.ods",
        "libreoffice/field-notes.epub",
        "upstream/hdr-header-footer.docx",
        "upstream/comments-rich-para.docx",
        "upstream/txt-text.pptx",
        "upstream/sld-notes.pptx",
    ];
    let mut low = Vec::new();
    for name in names {
        let file_name = name.rsplit('/').next().unwrap();
        let reference = String::from_utf8(fixture(&format!("reference/{file_name}.txt"))).unwrap();
        let ours = parse(name)
            .unwrap_or_else(|error| panic!("{name}: {error}"))
            .text;
        let (recall, missing) = word_recall(&reference, &ours);
        eprintln!(
            "{name}: word recall {recall:.3} of {} reference words, missing {missing:?}",
            words(&reference).len()
        );
        if recall < 0.95 {
            low.push(format!("{name}: {recall:.3}, missing {missing:?}"));
        }
    }
    assert!(low.is_empty(), "below 0.95 word recall: {low:#?}");
}
