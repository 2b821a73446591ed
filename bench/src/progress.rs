//! A progress line on stderr: redrawn in place on a terminal, one line every few seconds
//! when stderr is a file or a pipe (so CI logs stay short).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const LOG_INTERVAL: Duration = Duration::from_secs(5);

pub struct ProgressLine {
    terminal: bool,
    last_logged: Option<Instant>,
    drawn: bool,
}

impl Default for ProgressLine {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressLine {
    pub fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            last_logged: None,
            drawn: false,
        }
    }

    /// Shows `line`; off a terminal only if the last line is old enough.
    pub fn update(&mut self, line: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(stderr, "\r\x1b[2K{line}");
            let _ = stderr.flush();
            self.drawn = true;
        } else if self
            .last_logged
            .is_none_or(|last| last.elapsed() >= LOG_INTERVAL)
        {
            let _ = writeln!(stderr, "{line}");
            self.last_logged = Some(Instant::now());
        }
    }

    /// Shows `line` for good and moves to a fresh line.
    pub fn finish(&mut self, line: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal && self.drawn {
            let _ = writeln!(stderr, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(stderr, "{line}");
        }
        self.drawn = false;
        self.last_logged = None;
    }
}
