//! Extracts the text of PDFs as ingestion does (`sift_parse::pdf::parse_pdf`, guarded, default
//! limits but the page cap) and times it: `pdf_text OUT_DIR FILE...` writes `OUT_DIR/NAME.txt`
//! (pages separated by a form feed, as `pdftotext` does) and prints `NAME PAGES SECONDS
//! SCANNED TABLES` (SCANNED: the pages left to OCR, without text or with a garbled text layer,
//! as `2,5` or `-`; TABLES: the pages read as Markdown because a table was found on them, the
//! same way) or `NAME error CODE` per file. `scripts/pdf-bench.py` compares it with `pdftotext`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use sift_parse::pdf::{PdfLimits, parse_pdf};

fn main() {
    let mut args = std::env::args_os().skip(1);
    let Some(out_dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: pdf_text OUT_DIR FILE...");
        std::process::exit(2);
    };
    let limits = PdfLimits {
        max_pages: 100_000,
        ..PdfLimits::default()
    };
    for path in args.map(PathBuf::from) {
        let name = file_stem(&path);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) => {
                println!("{name} error read:{error}");
                continue;
            }
        };
        let started = Instant::now();
        let parsed = parse_pdf(&bytes, &limits);
        let seconds = started.elapsed().as_secs_f64();
        match parsed {
            Ok(document) => {
                let pages: Vec<&str> = document
                    .pages
                    .iter()
                    .map(|page| &document.text[page.start..page.end])
                    .collect();
                let last = document.pages.last().map_or(0, |page| page.number);
                let out = out_dir.join(format!("{name}.txt"));
                if let Err(error) = std::fs::write(&out, pages.join("\n\u{c}")) {
                    eprintln!("{}: {error}", out.display());
                }
                let scanned: Vec<String> = document
                    .scanned_pages
                    .iter()
                    .map(|page| page.number.to_string())
                    .collect();
                let scanned = if scanned.is_empty() {
                    "-".to_string()
                } else {
                    scanned.join(",")
                };
                let tables: Vec<String> = document
                    .pages
                    .iter()
                    .filter(|page| {
                        document.text[page.start..page.end]
                            .lines()
                            .any(|line| line.starts_with("|---"))
                    })
                    .map(|page| page.number.to_string())
                    .collect();
                let tables = if tables.is_empty() {
                    "-".to_string()
                } else {
                    tables.join(",")
                };
                println!("{name} {last} {seconds:.6} {scanned} {tables}");
            }
            Err(error) => println!("{name} error {} {seconds:.6}", error.code()),
        }
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default()
}
