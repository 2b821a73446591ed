//! One page's extracted text made clean: LF line ends, no control characters, no trailing
//! spaces, words hyphenated at a line end joined again, at most one blank line in a row.

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

#[cfg(test)]
mod tests {
    use super::*;

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
