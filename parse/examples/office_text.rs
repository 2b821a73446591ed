//! Extracts the text of Office files as ingestion does (`sift_parse::parse::parse_document`,
//! default limits, the format from the file name) and times it: `office_text OUT_DIR FILE...`
//! writes `OUT_DIR/NAME.txt` (the Markdown) and prints `NAME CHARS SECONDS` or
//! `NAME error CODE` per file. `scripts/office-bench.py` compares it with python-docx and
//! python-pptx.

use std::path::{Path, PathBuf};
use std::time::Instant;

use sift_parse::parse::{ParseOptions, SourceFormat, parse_document};

fn main() {
    let mut args = std::env::args_os().skip(1);
    let Some(out_dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: office_text OUT_DIR FILE...");
        std::process::exit(2);
    };
    let options = ParseOptions::default();
    for path in args.map(PathBuf::from) {
        let name = file_name(&path);
        let Some(format) = SourceFormat::from_file_name(&name) else {
            println!("{name} error unsupported_type");
            continue;
        };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) => {
                println!("{name} error read:{error}");
                continue;
            }
        };
        let started = Instant::now();
        let parsed = parse_document(&bytes, format, &options);
        let seconds = started.elapsed().as_secs_f64();
        match parsed {
            Ok(document) => {
                let out = out_dir.join(format!("{name}.txt"));
                if let Err(error) = std::fs::write(&out, &document.text) {
                    eprintln!("{}: {error}", out.display());
                }
                println!("{name} {} {seconds:.6}", document.text.chars().count());
            }
            Err(error) => println!("{name} error {}", error.code()),
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}
