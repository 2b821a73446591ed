//! Uploaded bytes -> text -> chunks, with no runtime, index or model behind it.
//!
//! [`parse`] detects the encoding of an upload and extracts its text (plain text, Markdown,
//! HTML, JSON, JSON Lines; PDF through [`pdf`]; Word, PowerPoint, spreadsheets, CSV and EPUB
//! through [`office`], as Markdown); [`chunk`] cuts that text into token-sized
//! children and parents (page by page for a PDF, so that every chunk knows its pages);
//! [`worker`] runs the parsers fuzzing caught spinning (PDF, `.xls`) in a child process
//! killed at the time budget.
//! This crate is the home of every format parser: it is small on purpose so that the fuzz
//! targets (`fuzz/`, built with sanitizer coverage) compile it in minutes, not the whole
//! ingestion stack. `sift-actors` re-exports both modules as `sift_actors::ingest::{parse,
//! chunk}`.

pub mod chunk;
pub mod image;
pub mod office;
pub mod parse;
pub mod pdf;
pub mod worker;
