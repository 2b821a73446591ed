//! Parsing a PDF in a child process, killed at the time budget (ADR 0024).
//!
//! A parse stuck inside one page cannot be stopped from inside the process: the guarded
//! thread of [`super::parse_pdf`] can only be abandoned, and it keeps a core busy until it
//! ends. With [`PdfLimits::worker`] set (a node started from the `sift` binary sets it to
//! that binary), each PDF is parsed by `sift __parse-pdf`: the bytes go in on stdin, the
//! worker parses them on the same guarded thread and writes one JSON [`Reply`] on stdout. The
//! parent waits until the budget (plus a grace period) and kills the worker past it, so a
//! hang costs one budget of one core, and an abort, a stack overflow or an allocation failure
//! inside the parser ends the worker, not the node.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{BUDGET_GRACE, PdfLimits, over_budget, parse_on_thread, reason};
use crate::parse::{Page, ParseError, ParsedDocument};

/// The first argument that makes the `sift` binary a parse worker.
pub const WORKER_COMMAND: &str = "__parse-pdf";

/// Longest reply read from a worker: the text of `max_pages` dense pages fits many times.
const MAX_REPLY_BYTES: u64 = 1 << 30;

/// How often the parent looks whether the worker has ended.
const POLL: Duration = Duration::from_millis(5);

/// What a worker writes on stdout.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Parsed {
        title: Option<String>,
        text: String,
        pages: Vec<WirePage>,
    },
    Failed {
        code: String,
        detail: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct WirePage {
    number: u32,
    start: usize,
    end: usize,
    heading_path: Vec<String>,
}

/// Parses `bytes` in a worker process started from `program`, under `limits`.
pub(super) fn parse_in_child(
    program: &Path,
    bytes: &[u8],
    limits: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    let deadline = Instant::now() + limits.time_budget + BUDGET_GRACE;
    let mut child = Command::new(program)
        .arg(WORKER_COMMAND)
        .arg(limits.max_pages.to_string())
        .arg(limits.time_budget.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| {
            ParseError::InvalidPdf(format!(
                "no parse worker could start ({}): {error}",
                program.display()
            ))
        })?;
    // Both pipes are served on threads of their own, so that neither side blocks the other
    // and the wait below keeps its deadline.
    let mut stdin = child.stdin.take();
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(stdin) = stdin.as_mut() {
            let _ = stdin.write_all(&input);
        }
    });
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut reply = Vec::new();
        if let Some(stdout) = stdout {
            let _ = stdout.take(MAX_REPLY_BYTES).read_to_end(&mut reply);
        }
        reply
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writer.join();
                let _ = reader.join();
                return Err(over_budget(limits));
            }
        }
    };
    let _ = writer.join();
    let reply = reader.join().unwrap_or_default();
    match serde_json::from_slice::<Reply>(&reply) {
        Ok(reply) => from_reply(reply),
        Err(_) => Err(ParseError::InvalidPdf(reason(&format!(
            "the parser stopped without an answer ({})",
            describe(status)
        )))),
    }
}

fn from_reply(reply: Reply) -> Result<ParsedDocument, ParseError> {
    match reply {
        Reply::Parsed { title, text, pages } => {
            let pages: Vec<Page> = pages
                .into_iter()
                .map(|page| Page {
                    number: page.number,
                    start: page.start,
                    end: page.end,
                    heading_path: page.heading_path,
                })
                .collect();
            // The worker is our own binary, but its reply crosses a pipe: a page range that
            // does not fit the text would make the chunker slice out of bounds.
            let fits = pages.iter().all(|page| {
                page.start <= page.end
                    && text.is_char_boundary(page.start)
                    && text.is_char_boundary(page.end)
            });
            if !fits {
                return Err(ParseError::InvalidPdf(
                    "the parse worker answered page ranges outside its text".into(),
                ));
            }
            Ok(ParsedDocument {
                title,
                text,
                markdown: false,
                encoding: "PDF",
                pages,
            })
        }
        Reply::Failed { code, detail } => Err(match code.as_str() {
            "encrypted_pdf" => ParseError::EncryptedPdf,
            "no_text_layer" => ParseError::NoTextLayer,
            "pdf_too_large" => ParseError::PdfTooLarge(detail),
            _ => ParseError::InvalidPdf(detail),
        }),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended".into(),
    }
}

/// The worker's side: `args` are the arguments after [`WORKER_COMMAND`] (page cap, budget in
/// ms); reads the PDF from `input`, parses it on the guarded thread, writes the reply to
/// `output`. Returns the process's exit status.
pub fn serve_worker(args: &[String], input: impl Read, mut output: impl Write) -> u8 {
    let limits = match args {
        [pages, budget_ms] => match (pages.parse(), budget_ms.parse()) {
            (Ok(max_pages), Ok(ms)) => PdfLimits {
                max_pages,
                time_budget: Duration::from_millis(ms),
                worker: None,
            },
            _ => return 2,
        },
        _ => return 2,
    };
    let mut bytes = Vec::new();
    if input.take(u64::MAX).read_to_end(&mut bytes).is_err() {
        return 1;
    }
    let reply = match parse_on_thread(&bytes, &limits) {
        Ok(parsed) => Reply::Parsed {
            title: parsed.title,
            text: parsed.text,
            pages: parsed
                .pages
                .into_iter()
                .map(|page| WirePage {
                    number: page.number,
                    start: page.start,
                    end: page.end,
                    heading_path: page.heading_path,
                })
                .collect(),
        },
        Err(error) => Reply::Failed {
            code: error.code().to_string(),
            detail: match error {
                ParseError::InvalidPdf(detail) | ParseError::PdfTooLarge(detail) => detail,
                other => other.to_string(),
            },
        },
    };
    let written = serde_json::to_writer(&mut output, &reply)
        .map_err(std::io::Error::from)
        .and_then(|()| output.flush());
    match written {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(reply: &Reply) -> Vec<u8> {
        serde_json::to_vec(reply).unwrap()
    }

    #[test]
    fn a_reply_comes_back_as_the_document_or_the_error_it_names() {
        let reply: Reply = serde_json::from_slice(&encode(&Reply::Parsed {
            title: Some("T".into()),
            text: "one\n\ntwo".into(),
            pages: vec![
                WirePage {
                    number: 1,
                    start: 0,
                    end: 3,
                    heading_path: vec!["Intro".into()],
                },
                WirePage {
                    number: 2,
                    start: 5,
                    end: 8,
                    heading_path: vec![],
                },
            ],
        }))
        .unwrap();
        let parsed = from_reply(reply).unwrap();
        assert_eq!(parsed.text, "one\n\ntwo");
        assert_eq!(parsed.pages[1].number, 2);
        assert_eq!(parsed.encoding, "PDF");
        for (code, expected) in [
            ("encrypted_pdf", "encrypted_pdf"),
            ("no_text_layer", "no_text_layer"),
            ("pdf_too_large", "pdf_too_large"),
            ("invalid_pdf", "invalid_pdf"),
            ("anything_else", "invalid_pdf"),
        ] {
            let error = from_reply(Reply::Failed {
                code: code.into(),
                detail: "why".into(),
            })
            .unwrap_err();
            assert_eq!(error.code(), expected);
        }
    }

    #[test]
    fn page_ranges_outside_the_text_are_refused() {
        let error = from_reply(Reply::Parsed {
            title: None,
            text: "é".into(),
            pages: vec![WirePage {
                number: 1,
                start: 0,
                end: 1, // inside the two bytes of é
                heading_path: vec![],
            }],
        })
        .unwrap_err();
        assert_eq!(error.code(), "invalid_pdf");
    }

    #[test]
    fn the_worker_answers_bad_arguments_and_non_pdf_input_clearly() {
        let mut out = Vec::new();
        assert_eq!(serve_worker(&["x".into()], &b""[..], &mut out), 2);
        assert!(out.is_empty());
        let status = serve_worker(
            &["10".into(), "5000".into()],
            &b"not a pdf at all"[..],
            &mut out,
        );
        assert_eq!(status, 0);
        let Reply::Failed { code, .. } = serde_json::from_slice(&out).unwrap() else {
            panic!("a reply of failure: {}", String::from_utf8_lossy(&out));
        };
        assert_eq!(code, "invalid_pdf");
    }

    #[test]
    fn a_worker_that_dies_without_a_reply_fails_the_document_not_the_caller() {
        // `false` exits 1 without reading or writing: what a crashed worker looks like.
        let limits = PdfLimits {
            worker: Some("false".into()),
            ..PdfLimits::default()
        };
        let error = parse_in_child(Path::new("false"), b"%PDF-1.4", &limits).unwrap_err();
        assert_eq!(error.code(), "invalid_pdf");
        assert!(error.to_string().contains("exit status 1"), "{error}");
    }

    #[test]
    fn a_worker_past_the_budget_is_killed() {
        // A program that never answers stands for a parser spinning inside a page.
        let dir = std::env::temp_dir().join(format!("sift-pdf-worker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("hangs");
        std::fs::write(&program, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(
            &program,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let limits = PdfLimits {
            time_budget: Duration::from_millis(200),
            worker: Some(program.clone()),
            ..PdfLimits::default()
        };
        let started = Instant::now();
        let error = parse_in_child(&program, b"%PDF-1.4", &limits).unwrap_err();
        assert_eq!(error.code(), "pdf_too_large");
        assert!(started.elapsed() < Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
