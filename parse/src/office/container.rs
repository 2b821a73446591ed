//! A zip container (docx, pptx, xlsx, ods, epub) read under [`OfficeLimits`].
//!
//! The sizes a zip declares are the attacker's to choose, so none is trusted: every read goes
//! through `Read::take` with what is left of the budget, and the bytes actually inflated are
//! what is charged. Buffers grow with what was read, never to a declared size.

use std::cell::Cell;
use std::io::{Cursor, Read};

use zip::ZipArchive;

use super::OfficeLimits;
use crate::parse::ParseError;

pub(crate) struct Container<'a> {
    archive: ZipArchive<Cursor<&'a [u8]>>,
    /// Bytes that may still be inflated, all entries together.
    budget: Cell<u64>,
    limit: u64,
}

impl<'a> Container<'a> {
    /// Opens the archive, refusing one with more than `limits.max_entries` entries.
    pub(crate) fn open(bytes: &'a [u8], limits: &OfficeLimits) -> Result<Self, ParseError> {
        let archive = ZipArchive::new(Cursor::new(bytes))
            .map_err(|error| ParseError::InvalidDocument(format!("not a readable zip: {error}")))?;
        if archive.len() > limits.max_entries {
            return Err(ParseError::DocumentTooLarge(format!(
                "the zip archive has {} entries, more than the {} allowed",
                archive.len(),
                limits.max_entries
            )));
        }
        Ok(Container {
            archive,
            budget: Cell::new(limits.max_unpacked_bytes),
            limit: limits.max_unpacked_bytes,
        })
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.archive.index_for_name(name).is_some()
    }

    /// The inflated bytes of entry `name`, `None` when there is no such entry.
    pub(crate) fn read(&mut self, name: &str) -> Result<Option<Vec<u8>>, ParseError> {
        let Some(index) = self.archive.index_for_name(name) else {
            return Ok(None);
        };
        self.read_index(index).map(Some)
    }

    /// The entry `name` as text (UTF-8, or UTF-16 by its BOM), `None` when there is no such
    /// entry.
    pub(crate) fn read_text(&mut self, name: &str) -> Result<Option<String>, ParseError> {
        let Some(bytes) = self.read(name)? else {
            return Ok(None);
        };
        // XML parts are UTF-8, or UTF-16 with a BOM; anything else is broken.
        let decoded = match encoding_rs::Encoding::for_bom(&bytes) {
            Some((encoding, bom_length)) => encoding
                .decode_without_bom_handling_and_without_replacement(&bytes[bom_length..])
                .map(|text| text.into_owned()),
            None => String::from_utf8(bytes).ok(),
        };
        decoded.map(Some).ok_or_else(|| {
            ParseError::InvalidDocument(format!("the part {name} is not UTF-8 or UTF-16 text"))
        })
    }

    /// Inflates every entry once, charging the budget, without keeping anything: the check
    /// that must pass before a parser that reads the archive itself (calamine) is given it.
    pub(crate) fn check_every_entry(&mut self) -> Result<(), ParseError> {
        for index in 0..self.archive.len() {
            let mut entry = self.archive.by_index(index).map_err(|error| {
                ParseError::InvalidDocument(format!("unreadable zip entry: {error}"))
            })?;
            let allowed = self.budget.get();
            let copied = std::io::copy(&mut (&mut entry).take(allowed + 1), &mut std::io::sink())
                .map_err(|error| {
                ParseError::InvalidDocument(format!("unreadable zip entry: {error}"))
            })?;
            drop(entry);
            self.charge(copied)?;
        }
        Ok(())
    }

    fn read_index(&mut self, index: usize) -> Result<Vec<u8>, ParseError> {
        let mut entry = self.archive.by_index(index).map_err(|error| {
            ParseError::InvalidDocument(format!("unreadable zip entry: {error}"))
        })?;
        let allowed = self.budget.get();
        let mut bytes = Vec::new();
        (&mut entry)
            .take(allowed + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| {
                ParseError::InvalidDocument(format!("unreadable zip entry: {error}"))
            })?;
        drop(entry);
        self.charge(bytes.len() as u64)?;
        Ok(bytes)
    }

    fn charge(&self, bytes: u64) -> Result<(), ParseError> {
        let left = self.budget.get();
        if bytes > left {
            self.budget.set(0);
            return Err(ParseError::DocumentTooLarge(format!(
                "the zip archive unpacks to more than {} MiB",
                self.limit / (1024 * 1024)
            )));
        }
        self.budget.set(left - bytes);
        Ok(())
    }
}

/// The directory part of a zip path (`"ppt/slides/slide1.xml"` -> `"ppt/slides"`).
pub(crate) fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Resolves a relationship or manifest target against `base_dir`: `..` and `.` segments,
/// an absolute target (`/word/media/x.png`), percent escapes and a `#fragment` handled.
pub(crate) fn resolve(base_dir: &str, target: &str) -> String {
    let target = target.split('#').next().unwrap_or("");
    let target = percent_decode(target);
    let mut parts: Vec<&str> = Vec::new();
    let joined;
    let full = if let Some(absolute) = target.strip_prefix('/') {
        absolute
    } else {
        joined = format!("{base_dir}/{target}");
        joined.as_str()
    };
    for segment in full.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

fn percent_decode(text: &str) -> String {
    if !text.contains('%') {
        return text.to_string();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && let Some(hex) = text.get(index + 1..index + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_string())
}
