//! Parsing in a child process, killed at the time budget (ADR 0024; `.xls` since ADR 0030).
//!
//! A parse stuck inside a third-party parser cannot be stopped from inside the process: a
//! guarded thread ([`on_guarded_thread`]) can only be abandoned, and it keeps a core busy
//! until it ends. With a worker program set ([`PdfLimits::worker`]: a node started from the
//! `sift` binary sets it to that binary), each PDF and each `.xls` workbook is parsed by
//! `sift __parse pdf ...` or `sift __parse xls ...`: the bytes go in on stdin, the worker
//! parses them and writes JSON lines on stdout: a [`Reply::Progress`] as pages are read (the
//! parent hands them to [`PdfLimits::report`]), then the one [`Reply`] that ends it. The parent waits until the budget
//! (plus a grace period) and kills the worker past it, so a hang costs one budget of one
//! core, and an abort, a stack overflow or an allocation failure inside the parser ends the
//! worker, not the node. The worker caps its own address space at what it holds when it
//! starts plus [`PdfLimits::worker_memory_bytes`] (`RLIMIT_AS`), so a file that inflates to
//! gigabytes (a decompression bomb) fails its allocation there: the worker aborts with Rust's
//! "memory allocation of N bytes failed" on stderr, which the parent reads to answer
//! `pdf_too_large` (`document_too_large` for a workbook).
//!
//! The two jobs are the parsers fuzzing caught spinning: pdf_oxide on a crafted page, and
//! calamine's reader of OLE compound files on a crafted sector chain.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::office::OfficeLimits;
use crate::parse::{Page, ParseError, ParsedDocument, ScannedPage};
use crate::pdf::{
    BUDGET_GRACE, PageReport, PdfLimits, Scanned, budget_detail, over_budget, parse_on_thread,
    reason,
};

/// The first argument that makes the `sift` binary a parse worker; the second names the job
/// (`pdf` or `xls`).
pub const WORKER_COMMAND: &str = "__parse";

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

/// What a worker writes on stdout, one JSON value a line: progress, then the answer.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    /// Pages read so far (a step of [`PageReport`]); more lines follow.
    Progress {
        done: u32,
        total: u32,
    },
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
    #[serde(default)]
    image_covers_page: bool,
    #[serde(default)]
    size_points: Option<(u32, u32)>,
}

/// What a worker parses, with its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Job {
    Pdf(PdfLimits),
    /// An Excel 97-2003 workbook, under the row and cell caps of its limits.
    Xls(OfficeLimits),
}

impl Job {
    /// The arguments after [`WORKER_COMMAND`] that [`Job::from_args`] reads back, with the
    /// budget and the memory cap of `process`.
    fn to_args(&self, process: &PdfLimits) -> Vec<OsString> {
        let budget_ms = process.time_budget.as_millis().to_string();
        let memory = process.worker_memory_bytes.to_string();
        match self {
            Job::Pdf(limits) => {
                let mut args: Vec<OsString> = vec![
                    "pdf".into(),
                    limits.max_pages.to_string().into(),
                    budget_ms.into(),
                    memory.into(),
                ];
                match &limits.scanned {
                    Scanned::Refuse => {}
                    Scanned::Accept => args.push("accept".into()),
                    Scanned::SaveImages(folder) => {
                        args.push("images".into());
                        args.push(folder.clone().into_os_string());
                    }
                }
                args
            }
            Job::Xls(limits) => vec![
                "xls".into(),
                budget_ms.into(),
                memory.into(),
                limits.max_rows.to_string().into(),
                limits.max_cells.to_string().into(),
            ],
        }
    }

    /// The job a worker's arguments name and its memory budget, `None` when they are not
    /// what [`Job::to_args`] writes or the memory budget is below [`MIN_WORKER_MEMORY_BYTES`].
    fn from_args(args: &[String]) -> Option<(Job, u64)> {
        let (kind, rest) = args.split_first()?;
        match (kind.as_str(), rest) {
            ("pdf", [pages, budget_ms, memory, scanned @ ..]) => {
                let scanned = match scanned {
                    [] => Scanned::Refuse,
                    [accept] if accept == "accept" => Scanned::Accept,
                    [images, folder] if images == "images" => {
                        Scanned::SaveImages(PathBuf::from(folder))
                    }
                    _ => return None,
                };
                let memory = worker_memory(memory)?;
                let limits = PdfLimits {
                    max_pages: pages.parse().ok()?,
                    time_budget: Duration::from_millis(budget_ms.parse().ok()?),
                    worker: None,
                    worker_memory_bytes: memory,
                    scanned,
                    report: PageReport::default(),
                };
                Some((Job::Pdf(limits), memory))
            }
            ("xls", [budget_ms, memory, rows, cells]) => {
                // The parent keeps the budget: a worker past it is killed.
                budget_ms.parse::<u64>().ok()?;
                let limits = OfficeLimits {
                    max_rows: rows.parse().ok()?,
                    max_cells: cells.parse().ok()?,
                    ..OfficeLimits::default()
                };
                Some((Job::Xls(limits), worker_memory(memory)?))
            }
            _ => None,
        }
    }

    /// The error of a parse past its budget.
    fn over_budget(&self, process: &PdfLimits) -> ParseError {
        match self {
            Job::Pdf(_) => over_budget(process),
            Job::Xls(_) => ParseError::DocumentTooLarge(budget_detail(process)),
        }
    }

    /// The error of a worker that ran out of its memory.
    fn out_of_memory(&self, process: &PdfLimits) -> ParseError {
        let detail = format!(
            "parsing it needs more than the {} MiB a parse worker may take \
             (pdf_worker_memory_mb)",
            process.worker_memory_bytes >> 20
        );
        match self {
            Job::Pdf(_) => ParseError::PdfTooLarge(detail),
            Job::Xls(_) => ParseError::DocumentTooLarge(detail),
        }
    }

    /// The error of a worker that ended without a reply, or with one that is not well formed.
    fn unreadable(&self, detail: String) -> ParseError {
        match self {
            Job::Pdf(_) => ParseError::InvalidPdf(reason(&detail)),
            Job::Xls(_) => ParseError::InvalidDocument(reason(&detail)),
        }
    }
}

fn worker_memory(arg: &str) -> Option<u64> {
    let memory: u64 = arg.parse().ok()?;
    (memory >= MIN_WORKER_MEMORY_BYTES).then_some(memory)
}

/// Parses the PDF `bytes` in a worker process started from `program`, under `limits`.
pub(crate) fn parse_pdf_in_child(
    program: &Path,
    bytes: &[u8],
    limits: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    run_job(program, bytes, &Job::Pdf(limits.clone()), limits)
}

/// Parses the `.xls` workbook `bytes` in a worker process started from `program`, under
/// `limits`, with the budget and memory cap of `process`.
pub(crate) fn parse_xls_in_child(
    program: &Path,
    bytes: &[u8],
    limits: &OfficeLimits,
    process: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    run_job(program, bytes, &Job::Xls(limits.clone()), process)
}

fn run_job(
    program: &Path,
    bytes: &[u8],
    job: &Job,
    process: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    let deadline = Instant::now() + process.time_budget + BUDGET_GRACE;
    let mut child = Command::new(program)
        .arg(WORKER_COMMAND)
        .args(job.to_args(process))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| {
            job.unreadable(format!(
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
    let reader = read_replies(child.stdout.take(), process.report.clone());
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
                return Err(job.over_budget(process));
            }
        }
    };
    let _ = writer.join();
    let reply = reader.join().unwrap_or_default();
    let errors = errors.join().unwrap_or_default();
    match serde_json::from_slice::<Reply>(&reply) {
        Ok(reply) => from_reply(reply, job),
        Err(_) if String::from_utf8_lossy(&errors).contains(ALLOCATION_FAILED) => {
            Err(job.out_of_memory(process))
        }
        Err(_) => Err(job.unreadable(format!(
            "the parser stopped without an answer ({})",
            describe(status)
        ))),
    }
}

/// Reads a worker's stdout on a thread of its own: hands each progress line to `report` as
/// it comes and gives back the last line, the answer (at most [`MAX_REPLY_BYTES`] in all).
fn read_replies(
    pipe: Option<impl Read + Send + 'static>,
    report: PageReport,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let Some(pipe) = pipe else {
            return Vec::new();
        };
        let mut lines = BufReader::new(pipe.take(MAX_REPLY_BYTES));
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return line,
                Ok(_) if line.starts_with(b"{\"Progress\"") => {
                    if let Ok(Reply::Progress { done, total }) = serde_json::from_slice(&line) {
                        report.tell(done, total);
                    }
                }
                Ok(_) => return line,
            }
        }
    })
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

fn from_reply(reply: Reply, job: &Job) -> Result<ParsedDocument, ParseError> {
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
                return Err(
                    job.unreadable("the parse worker answered page ranges outside its text".into())
                );
            }
            // Saved images are files in the folder it was given, and only then.
            let images_fit = scanned.iter().all(|page| match (&page.image, job) {
                (None, _) => true,
                (
                    Some(image),
                    Job::Pdf(PdfLimits {
                        scanned: Scanned::SaveImages(folder),
                        ..
                    }),
                ) => image.parent() == Some(folder),
                (Some(_), _) => false,
            });
            if !images_fit {
                return Err(job.unreadable(
                    "the parse worker answered page images outside its folder".into(),
                ));
            }
            let (markdown, encoding) = match job {
                Job::Pdf(_) => (false, "PDF"),
                Job::Xls(_) => (true, "XLS"),
            };
            Ok(ParsedDocument {
                title,
                text,
                markdown,
                encoding,
                pages,
                scanned_pages: scanned
                    .into_iter()
                    .map(|page| ScannedPage {
                        number: page.number,
                        heading_path: page.heading_path,
                        image: page.image,
                        image_covers_page: page.image_covers_page,
                        size_points: page.size_points,
                    })
                    .collect(),
                pictures: Vec::new(),
            })
        }
        Reply::Progress { .. } => Err(job
            .unreadable("the parse worker ended after a progress line, without its answer".into())),
        Reply::Failed { code, detail } => Err(match code.as_str() {
            "encrypted_pdf" => ParseError::EncryptedPdf,
            "no_text_layer" => ParseError::NoTextLayer,
            "pdf_too_large" => ParseError::PdfTooLarge(detail),
            "empty_document" => ParseError::Empty,
            "unsupported_type" => ParseError::UnsupportedType(detail),
            "document_too_large" => ParseError::DocumentTooLarge(detail),
            _ => job.unreadable(detail),
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

/// The worker's side: `args` are the arguments after [`WORKER_COMMAND`] (the job and its
/// limits, as [`Job::to_args`] writes them); caps this process's address space (see the
/// module docs), reads the file from `input`, parses it, writes the reply to `output`.
/// Returns the process's exit status: 2 for bad arguments, 3 when the cap could not be set.
pub fn serve_worker(args: &[String], input: impl Read, output: impl Write + Send + 'static) -> u8 {
    let Some((job, memory)) = Job::from_args(args) else {
        return 2;
    };
    if cap_address_space(memory).is_err() {
        return 3;
    }
    answer(&job, input, output)
}

/// Parses the file read from `input` as `job` says and writes the [`Reply`] lines to
/// `output`: progress as pages are read, then the answer.
fn answer(job: &Job, input: impl Read, output: impl Write + Send + 'static) -> u8 {
    let mut bytes = Vec::new();
    if input.take(u64::MAX).read_to_end(&mut bytes).is_err() {
        return 1;
    }
    // The parse thread writes progress while this one waits for its answer.
    let output = Arc::new(Mutex::new(output));
    let parsed = match job {
        Job::Pdf(limits) => {
            let progress = Arc::clone(&output);
            let limits = PdfLimits {
                report: PageReport::new(move |done, total| {
                    if let Ok(mut out) = progress.lock() {
                        let _ = write_line(&mut *out, &Reply::Progress { done, total });
                    }
                }),
                ..limits.clone()
            };
            parse_on_thread(&bytes, &limits)
        }
        // The parent kills this process at the budget: no thread to give up on here.
        Job::Xls(limits) => crate::office::parse_xls_here(&bytes, limits),
    };
    let reply = match parsed {
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
                    image_covers_page: page.image_covers_page,
                    size_points: page.size_points,
                })
                .collect(),
        },
        Err(error) => Reply::Failed {
            code: error.code().to_string(),
            detail: match error {
                ParseError::InvalidPdf(detail)
                | ParseError::PdfTooLarge(detail)
                | ParseError::InvalidDocument(detail)
                | ParseError::DocumentTooLarge(detail)
                | ParseError::UnsupportedType(detail) => detail,
                other => other.to_string(),
            },
        },
    };
    let written = match output.lock() {
        Ok(mut out) => write_line(&mut *out, &reply),
        Err(_) => Err(std::io::Error::other("the output lock is poisoned")),
    };
    match written {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Writes `reply` as one JSON line and flushes it.
fn write_line(output: &mut impl Write, reply: &Reply) -> std::io::Result<()> {
    serde_json::to_writer(&mut *output, reply).map_err(std::io::Error::from)?;
    output.write_all(b"\n")?;
    output.flush()
}

/// How a parse on a guarded thread ended, when it did not give its result.
#[derive(Debug)]
pub(crate) enum Abandoned {
    /// The parser panicked, with this message.
    Panicked(String),
    /// The wait ran out; the thread is left to end on its own.
    OverBudget,
    /// No thread could start, or it ended without sending.
    Lost(String),
}

/// Runs `work` on a thread named `name` with a stack of `stack_bytes`, inside
/// `catch_unwind`, and waits at most `wait` for it. A parse that never ends cannot be stopped
/// from here: past the wait the thread is abandoned (a node run from the `sift` binary uses a
/// worker process instead).
pub(crate) fn on_guarded_thread<T: Send + 'static>(
    name: &str,
    stack_bytes: usize,
    wait: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Abandoned> {
    // Capacity 1: the parser never blocks on sending, even after the caller gave up.
    let (sender, receiver) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(stack_bytes)
        .spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = sender.send(outcome);
        })
        .map_err(|error| Abandoned::Lost(format!("no thread to parse it on: {error}")))?;
    match receiver.recv_timeout(wait) {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(panic)) => Err(Abandoned::Panicked(
            panic
                .downcast_ref::<&str>()
                .map(|message| message.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into()),
        )),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Abandoned::OverBudget),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Abandoned::Lost(
            "the parser stopped without an answer".into(),
        )),
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

    /// An output the test reads back after the worker wrote to it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }

        /// The last line: the answer.
        fn reply(&self) -> Reply {
            let bytes = self.bytes();
            let last = bytes
                .trim_ascii_end()
                .rsplit(|b| *b == b'\n')
                .next()
                .unwrap();
            serde_json::from_slice(last).unwrap()
        }
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    fn pdf_job(scanned: Scanned) -> Job {
        Job::Pdf(PdfLimits {
            scanned,
            ..PdfLimits::default()
        })
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
                image_covers_page: true,
                size_points: Some((612, 792)),
            }],
        }))
        .unwrap();
        let job = pdf_job(Scanned::SaveImages("/scratch/doc".into()));
        let parsed = from_reply(reply, &job).unwrap();
        assert_eq!(parsed.text, "one\n\ntwo");
        assert_eq!(parsed.pages[1].number, 2);
        assert_eq!(parsed.encoding, "PDF");
        assert!(!parsed.markdown);
        assert_eq!(parsed.scanned_pages[0].number, 3);
        assert_eq!(
            parsed.scanned_pages[0].image.as_deref(),
            Some(Path::new("/scratch/doc/page-3.png"))
        );
        assert!(parsed.scanned_pages[0].image_covers_page);
        assert_eq!(parsed.scanned_pages[0].size_points, Some((612, 792)));
        let workbook = Reply::Parsed {
            title: None,
            text: "# Stock\n\nRow 2: Item: lamp".into(),
            pages: Vec::new(),
            scanned: Vec::new(),
        };
        let parsed = from_reply(workbook, &Job::Xls(OfficeLimits::default())).unwrap();
        assert!(parsed.markdown);
        assert_eq!(parsed.encoding, "XLS");
        for (job, code, expected) in [
            (pdf_job(Scanned::Refuse), "encrypted_pdf", "encrypted_pdf"),
            (pdf_job(Scanned::Refuse), "no_text_layer", "no_text_layer"),
            (pdf_job(Scanned::Refuse), "pdf_too_large", "pdf_too_large"),
            (pdf_job(Scanned::Refuse), "invalid_pdf", "invalid_pdf"),
            (pdf_job(Scanned::Refuse), "anything_else", "invalid_pdf"),
            (
                Job::Xls(OfficeLimits::default()),
                "document_too_large",
                "document_too_large",
            ),
            (
                Job::Xls(OfficeLimits::default()),
                "empty_document",
                "empty_document",
            ),
            (
                Job::Xls(OfficeLimits::default()),
                "anything_else",
                "invalid_document",
            ),
        ] {
            let error = from_reply(
                Reply::Failed {
                    code: code.into(),
                    detail: "why".into(),
                },
                &job,
            )
            .unwrap_err();
            assert_eq!(error.code(), expected, "{job:?} {code}");
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
            &pdf_job(Scanned::Refuse),
        )
        .unwrap_err();
        assert_eq!(error.code(), "invalid_pdf");
        for job in [
            pdf_job(Scanned::Accept),
            pdf_job(Scanned::SaveImages("/scratch/doc".into())),
            Job::Xls(OfficeLimits::default()),
        ] {
            let error = from_reply(
                Reply::Parsed {
                    title: None,
                    text: String::new(),
                    pages: Vec::new(),
                    scanned: vec![WireScanned {
                        number: 1,
                        heading_path: Vec::new(),
                        image: Some("/etc/passwd".into()),
                        image_covers_page: true,
                        size_points: None,
                    }],
                },
                &job,
            )
            .unwrap_err();
            assert!(
                ["invalid_pdf", "invalid_document"].contains(&error.code()),
                "{job:?}"
            );
        }
    }

    #[test]
    fn a_job_goes_through_its_arguments_and_back() {
        let process = PdfLimits {
            time_budget: Duration::from_millis(5000),
            worker_memory_bytes: 1 << 30,
            ..PdfLimits::default()
        };
        let jobs = [
            Job::Pdf(PdfLimits {
                max_pages: 10,
                ..process.clone()
            }),
            Job::Pdf(PdfLimits {
                scanned: Scanned::Accept,
                ..process.clone()
            }),
            Job::Pdf(PdfLimits {
                scanned: Scanned::SaveImages("/scratch/d".into()),
                ..process.clone()
            }),
            Job::Xls(OfficeLimits {
                max_rows: 7,
                max_cells: 70,
                ..OfficeLimits::default()
            }),
        ];
        for job in jobs {
            let written: Vec<String> = job
                .to_args(&process)
                .into_iter()
                .map(|arg| arg.into_string().unwrap())
                .collect();
            let (read, memory) = Job::from_args(&written).unwrap();
            assert_eq!(read, job, "{written:?}");
            assert_eq!(memory, 1 << 30);
        }
    }

    #[test]
    fn the_worker_answers_bad_arguments_and_bad_input_clearly() {
        let out = Shared::default();
        assert_eq!(serve_worker(&args(&["x"]), &b""[..], out.clone()), 2);
        for bad in [
            &["pdf", "10", "5000"][..],
            &["pdf", "10", "x", "1073741824"],
            &["pdf", "10", "5000", "1073741824", "images"],
            &["xls", "5000", "1073741824", "7"],
            &["doc", "5000", "1073741824", "7", "70"],
            // the page count where the old `__parse-pdf` worker took it
            &["10", "5000", "1073741824"],
        ] {
            assert!(Job::from_args(&args(bad)).is_none(), "{bad:?}");
        }
        // A memory budget below what the parser thread's stack reserves.
        let small = (MIN_WORKER_MEMORY_BYTES - 1).to_string();
        assert!(Job::from_args(&args(&["pdf", "10", "5000", &small])).is_none());
        assert!(Job::from_args(&args(&["xls", "5000", &small, "7", "70"])).is_none());
        assert!(out.bytes().is_empty());
        // (serve_worker would cap this test process's memory: `answer` is what it runs next.)
        for (job, input, code) in [
            (
                &["pdf", "10", "5000", "1073741824"][..],
                &b"not a pdf at all"[..],
                "invalid_pdf",
            ),
            (
                &["xls", "5000", "1073741824", "100", "1000"],
                b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1 and then nothing of a workbook",
                "invalid_document",
            ),
        ] {
            let (job, _) = Job::from_args(&args(job)).unwrap();
            let out = Shared::default();
            assert_eq!(answer(&job, input, out.clone()), 0);
            let Reply::Failed { code: got, .. } = out.reply() else {
                panic!(
                    "a reply of failure: {}",
                    String::from_utf8_lossy(&out.bytes())
                );
            };
            assert_eq!(got, code);
        }
        assert!(address_space_now().unwrap() > 0);
    }

    #[test]
    fn a_worker_reports_each_page_and_the_parent_hands_them_on() {
        let pdf = std::fs::read(format!(
            "{}/../tests/fixtures/pdf/three-pages.pdf",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let (job, _) = Job::from_args(&args(&["pdf", "10", "5000", "1073741824"])).unwrap();
        let out = Shared::default();
        assert_eq!(answer(&job, &pdf[..], out.clone()), 0);
        let written = out.bytes();
        let lines: Vec<&[u8]> = written.trim_ascii_end().split(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 4, "{}", String::from_utf8_lossy(&written));
        for (index, line) in lines[..3].iter().enumerate() {
            let Ok(Reply::Progress { done, total }) = serde_json::from_slice(line) else {
                panic!("a progress line: {}", String::from_utf8_lossy(line));
            };
            assert_eq!((done, total), (index as u32 + 1, 3));
        }
        assert!(matches!(out.reply(), Reply::Parsed { pages, .. } if pages.len() == 3));

        // The parent's reader: the progress goes to the report, the answer comes back.
        let told = Arc::new(Mutex::new(Vec::new()));
        let report = {
            let told = Arc::clone(&told);
            PageReport::new(move |done, total| told.lock().unwrap().push((done, total)))
        };
        let answer = read_replies(Some(std::io::Cursor::new(written.clone())), report)
            .join()
            .unwrap();
        assert_eq!(*told.lock().unwrap(), [(1, 3), (2, 3), (3, 3)]);
        let parsed = from_reply(serde_json::from_slice(&answer).unwrap(), &job).unwrap();
        assert_eq!(parsed.pages.len(), 3);
    }

    #[test]
    fn a_worker_that_dies_without_a_reply_fails_the_document_not_the_caller() {
        // `false` exits 1 without reading or writing: what a crashed worker looks like.
        let limits = PdfLimits {
            worker: Some("false".into()),
            ..PdfLimits::default()
        };
        let error = parse_pdf_in_child(Path::new("false"), b"%PDF-1.4", &limits).unwrap_err();
        assert_eq!(error.code(), "invalid_pdf");
        assert!(error.to_string().contains("exit status 1"), "{error}");
        let error = parse_xls_in_child(Path::new("false"), b"", &OfficeLimits::default(), &limits)
            .unwrap_err();
        assert_eq!(error.code(), "invalid_document");
    }

    #[test]
    fn a_worker_past_the_budget_is_killed() {
        // A program that never answers stands for a parser spinning inside a page.
        let dir = std::env::temp_dir().join(format!("sift-parse-worker-{}", std::process::id()));
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
        let error = parse_pdf_in_child(&program, b"%PDF-1.4", &limits).unwrap_err();
        assert_eq!(error.code(), "pdf_too_large");
        let error =
            parse_xls_in_child(&program, b"", &OfficeLimits::default(), &limits).unwrap_err();
        assert_eq!(error.code(), "document_too_large");
        assert!(error.to_string().contains("budget"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_guarded_thread_gives_its_result_its_panic_or_up() {
        let wait = Duration::from_secs(10);
        assert_eq!(on_guarded_thread("t", 1 << 20, wait, || 7).unwrap(), 7);
        let panicked = on_guarded_thread("t", 1 << 20, wait, || -> u8 { panic!("no") });
        assert!(matches!(panicked, Err(Abandoned::Panicked(message)) if message == "no"));
        let (release, held) = mpsc::channel::<()>();
        let stuck = on_guarded_thread("t", 1 << 20, Duration::from_millis(50), move || {
            let _ = held.recv();
        });
        assert!(matches!(stuck, Err(Abandoned::OverBudget)));
        drop(release);
    }
}
