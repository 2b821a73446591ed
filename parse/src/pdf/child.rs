//! Parsing a PDF in a child process, killed at the time budget (ADR 0024).
//!
//! A parse stuck inside one page cannot be stopped from inside the process: the guarded
//! thread of [`super::parse_pdf`] can only be abandoned, and it keeps a core busy until it
//! ends. With [`PdfLimits::worker`] set (a node started from the `sift` binary sets it to
//! that binary), each PDF is parsed by `sift __parse-pdf`: the bytes go in on stdin, the
//! worker parses them on the same guarded thread and writes one JSON [`Reply`] on stdout. The
//! parent waits until the budget (plus a grace period) and kills the worker past it, so a
//! hang costs one budget of one core, and an abort, a stack overflow or an allocation failure
//! inside the parser ends the worker, not the node. The worker caps its own address space at
//! what it holds when it starts plus [`PdfLimits::worker_memory_bytes`] (`RLIMIT_AS`), so a
//! PDF that inflates to gigabytes (a decompression bomb) fails its allocation there: the
//! worker aborts with Rust's "memory allocation of N bytes failed" on stderr, which the
//! parent reads to answer `pdf_too_large`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{BUDGET_GRACE, PdfLimits, Scanned, over_budget, parse_on_thread, reason};
use crate::parse::{Page, ParseError, ParsedDocument, ScannedPage};

/// The first argument that makes the `sift` binary a parse worker.
pub const WORKER_COMMAND: &str = "__parse-pdf";

/// Longest reply read from a worker: the text of `max_pages` dense pages fits many times.
const MAX_REPLY_BYTES: u64 = 1 << 30;

/// How often the parent looks whether the worker has ended.
const POLL: Duration = Duration::from_millis(5);

/// Most of a worker's stderr kept: enough for the allocation failure's one line.
const MAX_STDERR_BYTES: u64 = 64 * 1024;

/// What Rust's default allocation-error handler writes before it aborts.
const ALLOCATION_FAILED: &str = "memory allocation of";

/// The smallest memory budget a worker accepts: the parser thread's stack alone reserves
/// 64 MiB of address space.
pub const MIN_WORKER_MEMORY_BYTES: u64 = 128 << 20;

/// What a worker writes on stdout.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Parsed {
        title: Option<String>,
        text: String,
        pages: Vec<WirePage>,
        #[serde(default)]
        scanned: Vec<WireScanned>,
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

#[derive(Debug, Serialize, Deserialize)]
struct WireScanned {
    number: u32,
    heading_path: Vec<String>,
    image: Option<PathBuf>,
}

/// The worker arguments that say what [`PdfLimits::scanned`] is: none (refuse), `accept`, or
/// `images` and the folder.
fn scanned_args(scanned: &Scanned) -> Vec<std::ffi::OsString> {
    match scanned {
        Scanned::Refuse => Vec::new(),
        Scanned::Accept => vec!["accept".into()],
        Scanned::SaveImages(folder) => vec!["images".into(), folder.clone().into_os_string()],
    }
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
        .arg(limits.worker_memory_bytes.to_string())
        .args(scanned_args(&limits.scanned))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
    let reader = read_on_thread(child.stdout.take(), MAX_REPLY_BYTES);
    let errors = read_on_thread(child.stderr.take(), MAX_STDERR_BYTES);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writer.join();
                let _ = reader.join();
                let _ = errors.join();
                return Err(over_budget(limits));
            }
        }
    };
    let _ = writer.join();
    let reply = reader.join().unwrap_or_default();
    let errors = errors.join().unwrap_or_default();
    match serde_json::from_slice::<Reply>(&reply) {
        Ok(reply) => from_reply(reply, &limits.scanned),
        Err(_) if String::from_utf8_lossy(&errors).contains(ALLOCATION_FAILED) => {
            Err(ParseError::PdfTooLarge(format!(
                "parsing it needs more than the {} MiB a parse worker may take \
                 (pdf_worker_memory_mb)",
                limits.worker_memory_bytes >> 20
            )))
        }
        Err(_) => Err(ParseError::InvalidPdf(reason(&format!(
            "the parser stopped without an answer ({})",
            describe(status)
        )))),
    }
}

/// Reads at most `limit` bytes of a child's pipe on a thread of its own.
fn read_on_thread(
    pipe: Option<impl Read + Send + 'static>,
    limit: u64,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let _ = pipe.take(limit).read_to_end(&mut bytes);
        }
        bytes
    })
}

fn from_reply(reply: Reply, asked: &Scanned) -> Result<ParsedDocument, ParseError> {
    match reply {
        Reply::Parsed {
            title,
            text,
            pages,
            scanned,
        } => {
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
            // Saved images are files in the folder it was given, and only then.
            let images_fit = scanned.iter().all(|page| match (&page.image, asked) {
                (None, _) => true,
                (Some(image), Scanned::SaveImages(folder)) => image.parent() == Some(folder),
                (Some(_), _) => false,
            });
            if !images_fit {
                return Err(ParseError::InvalidPdf(
                    "the parse worker answered page images outside its folder".into(),
                ));
            }
            Ok(ParsedDocument {
                title,
                text,
                markdown: false,
                encoding: "PDF",
                pages,
                scanned_pages: scanned
                    .into_iter()
                    .map(|page| ScannedPage {
                        number: page.number,
                        heading_path: page.heading_path,
                        image: page.image,
                    })
                    .collect(),
                pictures: Vec::new(),
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
/// ms, memory in bytes); caps this process's address space (see the module docs), reads the
/// PDF from `input`, parses it on the guarded thread, writes the reply to `output`. Returns
/// the process's exit status: 2 for bad arguments, 3 when the cap could not be set.
pub fn serve_worker(args: &[String], input: impl Read, output: impl Write) -> u8 {
    let Some(limits) = worker_limits(args) else {
        return 2;
    };
    if cap_address_space(limits.worker_memory_bytes).is_err() {
        return 3;
    }
    answer(&limits, input, output)
}

/// The limits a worker's arguments give, `None` when they are not three numbers (then what
/// [`scanned_args`] wrote) or the memory budget is below [`MIN_WORKER_MEMORY_BYTES`].
fn worker_limits(args: &[String]) -> Option<PdfLimits> {
    let (pages, budget_ms, memory, scanned) = match args {
        [pages, budget_ms, memory] => (pages, budget_ms, memory, Scanned::Refuse),
        [pages, budget_ms, memory, accept] if accept == "accept" => {
            (pages, budget_ms, memory, Scanned::Accept)
        }
        [pages, budget_ms, memory, images, folder] if images == "images" => (
            pages,
            budget_ms,
            memory,
            Scanned::SaveImages(PathBuf::from(folder)),
        ),
        _ => return None,
    };
    let memory: u64 = memory.parse().ok()?;
    if memory < MIN_WORKER_MEMORY_BYTES {
        return None;
    }
    Some(PdfLimits {
        max_pages: pages.parse().ok()?,
        time_budget: Duration::from_millis(budget_ms.parse().ok()?),
        worker: None,
        worker_memory_bytes: memory,
        scanned,
    })
}

/// Parses the PDF read from `input` under `limits` and writes the [`Reply`] to `output`.
fn answer(limits: &PdfLimits, input: impl Read, mut output: impl Write) -> u8 {
    let mut bytes = Vec::new();
    if input.take(u64::MAX).read_to_end(&mut bytes).is_err() {
        return 1;
    }
    let reply = match parse_on_thread(&bytes, limits) {
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
            scanned: parsed
                .scanned_pages
                .into_iter()
                .map(|page| WireScanned {
                    number: page.number,
                    heading_path: page.heading_path,
                    image: page.image,
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

/// Caps this process's address space at its present size plus `budget` bytes (never above
/// a hard limit already set).
fn cap_address_space(budget: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let held = address_space_now()?;
    let cap = held.saturating_add(budget);
    let present = getrlimit(Resource::As);
    let cap = present.maximum.map_or(cap, |maximum| cap.min(maximum));
    setrlimit(
        Resource::As,
        Rlimit {
            current: Some(cap),
            maximum: Some(cap),
        },
    )
    .map_err(std::io::Error::from)
}

/// This process's address space in bytes (`VmSize` of `/proc/self/status`).
fn address_space_now() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| std::io::Error::other("no VmSize in /proc/self/status"))
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
            scanned: vec![WireScanned {
                number: 3,
                heading_path: vec!["Intro".into()],
                image: Some("/scratch/doc/page-3.png".into()),
            }],
        }))
        .unwrap();
        let asked = Scanned::SaveImages("/scratch/doc".into());
        let parsed = from_reply(reply, &asked).unwrap();
        assert_eq!(parsed.text, "one\n\ntwo");
        assert_eq!(parsed.pages[1].number, 2);
        assert_eq!(parsed.encoding, "PDF");
        assert_eq!(parsed.scanned_pages[0].number, 3);
        assert_eq!(
            parsed.scanned_pages[0].image.as_deref(),
            Some(Path::new("/scratch/doc/page-3.png"))
        );
        for (code, expected) in [
            ("encrypted_pdf", "encrypted_pdf"),
            ("no_text_layer", "no_text_layer"),
            ("pdf_too_large", "pdf_too_large"),
            ("invalid_pdf", "invalid_pdf"),
            ("anything_else", "invalid_pdf"),
        ] {
            let error = from_reply(
                Reply::Failed {
                    code: code.into(),
                    detail: "why".into(),
                },
                &Scanned::Refuse,
            )
            .unwrap_err();
            assert_eq!(error.code(), expected);
        }
    }

    #[test]
    fn page_ranges_outside_the_text_and_images_outside_the_folder_are_refused() {
        let error = from_reply(
            Reply::Parsed {
                title: None,
                text: "é".into(),
                pages: vec![WirePage {
                    number: 1,
                    start: 0,
                    end: 1, // inside the two bytes of é
                    heading_path: vec![],
                }],
                scanned: Vec::new(),
            },
            &Scanned::Refuse,
        )
        .unwrap_err();
        assert_eq!(error.code(), "invalid_pdf");
        for asked in [Scanned::Accept, Scanned::SaveImages("/scratch/doc".into())] {
            let error = from_reply(
                Reply::Parsed {
                    title: None,
                    text: String::new(),
                    pages: Vec::new(),
                    scanned: vec![WireScanned {
                        number: 1,
                        heading_path: Vec::new(),
                        image: Some("/etc/passwd".into()),
                    }],
                },
                &asked,
            )
            .unwrap_err();
            assert_eq!(error.code(), "invalid_pdf", "{asked:?}");
        }
    }

    #[test]
    fn the_worker_answers_bad_arguments_and_non_pdf_input_clearly() {
        let args = |list: &[&str]| list.iter().map(|arg| arg.to_string()).collect::<Vec<_>>();
        let mut out = Vec::new();
        assert_eq!(serve_worker(&args(&["x"]), &b""[..], &mut out), 2);
        assert!(worker_limits(&args(&["10", "5000"])).is_none());
        assert!(worker_limits(&args(&["10", "x", "1073741824"])).is_none());
        assert!(worker_limits(&args(&["10", "5000", "1073741824", "images"])).is_none());
        assert_eq!(
            worker_limits(&args(&["10", "5000", "1073741824", "images", "/scratch/d"]))
                .unwrap()
                .scanned,
            Scanned::SaveImages("/scratch/d".into())
        );
        assert_eq!(
            worker_limits(&args(&["10", "5000", "1073741824", "accept"]))
                .unwrap()
                .scanned,
            Scanned::Accept
        );
        // A memory budget below what the parser thread's stack reserves.
        let small = (MIN_WORKER_MEMORY_BYTES - 1).to_string();
        assert!(worker_limits(&args(&["10", "5000", &small])).is_none());
        assert!(out.is_empty());
        // (serve_worker would cap this test process's memory: `answer` is what it runs next.)
        let limits = worker_limits(&args(&["10", "5000", "1073741824"])).unwrap();
        assert_eq!(limits.worker_memory_bytes, 1 << 30);
        assert_eq!(limits.time_budget, Duration::from_millis(5000));
        let status = answer(&limits, &b"not a pdf at all"[..], &mut out);
        assert_eq!(status, 0);
        let Reply::Failed { code, .. } = serde_json::from_slice(&out).unwrap() else {
            panic!("a reply of failure: {}", String::from_utf8_lossy(&out));
        };
        assert_eq!(code, "invalid_pdf");
        assert!(address_space_now().unwrap() > 0);
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
