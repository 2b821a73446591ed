//! One page's extracted text made clean: LF line ends, no control characters, no trailing
//! spaces, words hyphenated at a line end joined again, at most one blank line in a row; and
//! across pages, running headers and footers (page numbers included) dropped.

use crate::parse::clean_extracted;

/// `raw` (a page's text as the parser gives it) cleaned; empty when the page has no text.
pub(super) fn clean_page_text(raw: &str) -> String {
    let cleaned = clean_extracted(raw);
    let mut out = String::with_capacity(cleaned.len());
    let mut blank_run = 0;
    let mut lines = cleaned.lines().map(str::trim_end).peekable();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        blank_run = 0;
        let mut line = line.to_string();
        // "infor-" + "mation" -> "information": a hyphen after a letter at the end of a line,
        // and the next line goes on in lower case.
        while let Some(stem) = hyphenated_stem(&line)
            && let Some(next) = lines.peek()
            && next.trim_start().starts_with(|c: char| c.is_lowercase())
        {
            let next = lines.next().unwrap_or_default().trim_start();
            let (word, rest) = match next.find(char::is_whitespace) {
                Some(cut) => (&next[..cut], next[cut..].trim_start()),
                None => (next, ""),
            };
            let mut joined = format!("{stem}{word}");
            if !rest.is_empty() {
                // The rest of the next line stays on a line of its own, as laid out.
                out.push_str(&joined);
                out.push('\n');
                joined = rest.to_string();
            }
            line = joined;
        }
        out.push_str(&line);
    }
    out
}

/// `line` without its final hyphen when it ends in a letter and a hyphen.
fn hyphenated_stem(line: &str) -> Option<&str> {
    let stem = line.strip_suffix('-')?;
    stem.chars()
        .next_back()
        .is_some_and(char::is_alphabetic)
        .then_some(stem)
}

/// Lines within this many of a page's top or bottom may be a running header or footer.
const RUNNING_LINE_DEPTH: usize = 2;

/// Drops running headers and footers: a line among the first or last
/// [`RUNNING_LINE_DEPTH`] lines of a page that recurs in that place on at least half of the
/// pages (and on three or more), compared by [`running_key`] (so "Page 3 of 12" and a bare
/// page number recur too). Documents of fewer than three pages
/// are left as they are: nothing can be told to repeat.
pub(super) fn strip_running_lines(pages: &mut [String]) {
    if pages.len() < 3 {
        return;
    }
    let threshold = pages.len().div_ceil(2).max(3);
    let edges = |page: &str| -> (Vec<String>, Vec<String>) {
        let lines: Vec<&str> = page
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        let top = lines
            .iter()
            .take(RUNNING_LINE_DEPTH)
            .map(|l| running_key(l))
            .collect();
        let bottom = lines
            .iter()
            .rev()
            .take(RUNNING_LINE_DEPTH)
            .map(|l| running_key(l))
            .collect();
        (top, bottom)
    };
    let mut top_counts: std::collections::HashMap<String, usize> = Default::default();
    let mut bottom_counts: std::collections::HashMap<String, usize> = Default::default();
    for page in pages.iter() {
        let (mut top, mut bottom) = edges(page);
        top.sort_unstable();
        top.dedup();
        bottom.sort_unstable();
        bottom.dedup();
        for key in top {
            *top_counts.entry(key).or_default() += 1;
        }
        for key in bottom {
            *bottom_counts.entry(key).or_default() += 1;
        }
    }
    let running = |counts: &std::collections::HashMap<String, usize>, key: &str| {
        !key.is_empty() && counts.get(key).is_some_and(|n| *n >= threshold)
    };
    for page in pages.iter_mut() {
        let lines: Vec<&str> = page.lines().collect();
        let content: Vec<usize> = (0..lines.len())
            .filter(|&i| !lines[i].trim().is_empty())
            .collect();
        let mut drop = vec![false; lines.len()];
        for &i in content.iter().take(RUNNING_LINE_DEPTH) {
            if running(&top_counts, &running_key(lines[i])) {
                drop[i] = true;
            }
        }
        for &i in content.iter().rev().take(RUNNING_LINE_DEPTH) {
            if running(&bottom_counts, &running_key(lines[i])) {
                drop[i] = true;
            }
        }
        // A page that is nothing but recurring lines (a form, a slide repeated) keeps them: its
        // text is its content.
        if !drop.contains(&true) || content.iter().all(|&i| drop[i]) {
            continue;
        }
        let kept: Vec<&str> = lines
            .iter()
            .zip(&drop)
            .filter(|(_, dropped)| !**dropped)
            .map(|(line, _)| *line)
            .collect();
        *page = kept.join("\n").trim().to_string();
    }
}

/// A line as running headers are compared: case and spacing ignored, and in a short line (at
/// most three words with letters: "Page 3 of 12", "- 7 -", "Chapter 2 | 41") digits masked,
/// so that page numbers recur; a longer line must recur as it is, numbers included.
fn running_key(line: &str) -> String {
    let words_with_letters = line
        .split_whitespace()
        .filter(|word| word.chars().any(char::is_alphabetic))
        .count();
    let mask = words_with_letters <= 3;
    let mut key = String::with_capacity(line.len());
    let mut last_space = true;
    for c in line.trim().chars() {
        if c.is_whitespace() {
            if !last_space {
                key.push(' ');
            }
            last_space = true;
            continue;
        }
        last_space = false;
        if mask && c.is_ascii_digit() {
            if !key.ends_with('#') {
                key.push('#');
            }
        } else {
            key.extend(c.to_lowercase());
        }
    }
    key.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(n: usize, body: &str) -> String {
        format!("Journal of Examples, Vol. 7\n\n{body}\n\nPage {n} of 4")
    }

    #[test]
    fn running_headers_and_page_numbers_are_dropped() {
        let mut pages: Vec<String> = (1..=4)
            .map(|n| page(n, &format!("Body text of page {n}, which says something.")))
            .collect();
        strip_running_lines(&mut pages);
        for (i, text) in pages.iter().enumerate() {
            assert_eq!(
                text,
                &format!("Body text of page {}, which says something.", i + 1)
            );
        }
    }

    #[test]
    fn lines_that_do_not_recur_and_short_documents_stay() {
        // A first line that differs on every page, and a "footer" on one page only.
        let mut pages = vec![
            "Introduction\nText one.".to_string(),
            "Methods\nText two.".to_string(),
            "Results\nText three.\nconfidential".to_string(),
        ];
        let before = pages.clone();
        strip_running_lines(&mut pages);
        assert_eq!(pages, before);
        // Pages that are nothing but the same lines keep them.
        let mut same = vec!["Form A\nSign here".to_string(); 4];
        strip_running_lines(&mut same);
        assert_eq!(same, vec!["Form A\nSign here".to_string(); 4]);
        // Two pages: nothing can be told to repeat.
        let mut two = vec![page(1, "a"), page(2, "b")];
        let before = two.clone();
        strip_running_lines(&mut two);
        assert_eq!(two, before);
        // The same line deep inside every page is content, not a header.
        let mut deep: Vec<String> = ["Introduction", "Methods", "Results", "Discussion"]
            .iter()
            .enumerate()
            .map(|(n, heading)| {
                format!(
                    "{heading}\nThe first finding of part {n} is stated here.\nRecurring sentence.\nThe last finding of part {n} is stated here.\nA closing remark on part {n} follows."
                )
            })
            .collect();
        let before = deep.clone();
        strip_running_lines(&mut deep);
        assert_eq!(deep, before);
    }

    #[test]
    fn running_keys_mask_digits_and_spacing() {
        assert_eq!(running_key("  Page 12  of   40 "), "page # of #");
        assert_eq!(running_key("17"), "#");
        assert_eq!(running_key("Chapter 2 | 41"), "chapter # | #");
        // a longer line keeps its numbers: body lines that differ only by a number differ
        assert_eq!(
            running_key("ACME Corp — Annual Report 2024"),
            "acme corp — annual report 2024"
        );
    }

    #[test]
    fn hyphenated_words_at_line_ends_are_joined() {
        assert_eq!(
            clean_page_text("the infor-\nmation age\nbegins"),
            "the information\nage\nbegins"
        );
        assert_eq!(clean_page_text("a hyphen-\nated"), "a hyphenated");
    }

    #[test]
    fn hyphens_that_are_not_line_end_hyphenation_stay() {
        // Next line in upper case, a number before the hyphen, a hyphen mid-line.
        assert_eq!(clean_page_text("Jean-\nPaul"), "Jean-\nPaul");
        assert_eq!(clean_page_text("pages 10-\n12"), "pages 10-\n12");
        assert_eq!(clean_page_text("well-known"), "well-known");
        assert_eq!(clean_page_text("ends-\n\nnext"), "ends-\n\nnext");
    }

    #[test]
    fn blank_runs_control_characters_and_trailing_spaces_are_cleaned() {
        assert_eq!(
            clean_page_text("\n\n  Title  \r\n\r\n\r\n\r\nbody\u{0}text \t\n\n"),
            "  Title\n\nbodytext"
        );
        assert_eq!(clean_page_text(" \n\t\n"), "");
    }
}
