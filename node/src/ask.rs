//! `sift ask KB "question"`: creates a session over the KB(s), asks, and renders the run's
//! event stream: thoughts dimmed, tool calls and their results, then the answer and its
//! numbered sources. Exits non-zero when the run ends in an error (or is stopped).

use std::io::{IsTerminal, Write};

use serde_json::Value;
use sift_api::NewSession;

use crate::cli::{CliError, Client};

const DIM: &str = "\x1b[2m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

pub async fn ask(
    client: &Client,
    kbs: &[String],
    question: &str,
    agent: Option<&str>,
    session: Option<&str>,
    raw: bool,
) -> Result<(), CliError> {
    let session_id = match session {
        // A follow-up in an existing session (its KBs and agent apply).
        Some(id) => id.to_string(),
        None => {
            let body = NewSession {
                kbs: kbs.to_vec(),
                agent: agent.map(str::to_string),
            };
            let session: Value = client.create_session(&body).await?;
            session["id"].as_str().unwrap_or_default().to_string()
        }
    };
    let mut events = client.ask(&session_id, question).await?;
    let styled = std::io::stdout().is_terminal();
    let mut renderer = Renderer {
        styled,
        raw,
        in_thought: false,
        answer_started: false,
        citations: Vec::new(),
        errors: Vec::new(),
        finish: None,
    };
    while let Some(event) = events.next_event().await {
        match event {
            Ok(event) => renderer.event(&event.event, &event.json()),
            Err(error) => return Err(CliError::Unreachable(format!("the stream broke: {error}"))),
        }
    }
    let outcome = renderer.finish();
    if !raw {
        eprintln!("session {session_id} (ask a follow-up with --session {session_id})");
    }
    outcome
}

struct Renderer {
    styled: bool,
    raw: bool,
    in_thought: bool,
    answer_started: bool,
    citations: Vec<Value>,
    errors: Vec<(String, String)>,
    finish: Option<String>,
}

impl Renderer {
    fn style(&self, style: &'static str) -> &'static str {
        if self.styled { style } else { "" }
    }

    fn end_thought(&mut self) {
        if self.in_thought {
            println!("{}", self.style(RESET));
            self.in_thought = false;
        }
    }

    fn event(&mut self, name: &str, data: &Value) {
        if self.raw {
            println!("{name} {data}");
        }
        match name {
            "thought" if !self.raw => {
                if !self.in_thought {
                    print!("{}", self.style(DIM));
                    self.in_thought = true;
                }
                print!("{}", data["delta"].as_str().unwrap_or(""));
            }
            "tool_call" if !self.raw => {
                self.end_thought();
                println!(
                    "→ {} {}",
                    data["name"].as_str().unwrap_or("?"),
                    data["arguments"]
                );
            }
            "tool_result" if !self.raw => {
                self.end_thought();
                println!(
                    "{}  ← {}{}",
                    self.style(DIM),
                    data["summary"].as_str().unwrap_or(""),
                    self.style(RESET)
                );
            }
            "delta" if !self.raw => {
                self.end_thought();
                if !self.answer_started {
                    println!();
                    self.answer_started = true;
                }
                print!("{}", data["text"].as_str().unwrap_or(""));
            }
            "citation" => self.citations.push(data.clone()),
            "partial" if !self.raw => {
                self.end_thought();
                eprintln!("warning: the answer is partial: {}", data["failed_shards"]);
            }
            "error" => {
                self.end_thought();
                let code = data["code"].as_str().unwrap_or("error").to_string();
                let message = data["message"].as_str().unwrap_or("").to_string();
                if !self.raw {
                    eprintln!("error {code}: {message}");
                }
                self.errors.push((code, message));
            }
            "done" => {
                self.end_thought();
                self.finish = data["finish_reason"].as_str().map(String::from);
            }
            _ => {}
        }
        let _ = std::io::stdout().flush();
    }

    fn finish(mut self) -> Result<(), CliError> {
        self.end_thought();
        if !self.raw {
            if self.answer_started {
                println!();
            }
            if !self.citations.is_empty() {
                println!("\n{}Sources{}", self.style(BOLD), self.style(RESET));
                for citation in &self.citations {
                    println!(
                        "  [{}] {} ({}, {})",
                        citation["n"],
                        citation["document_title"].as_str().unwrap_or(""),
                        // a page fetched by URL: where it was fetched from
                        citation["source_url"]
                            .as_str()
                            .or(citation["external_id"].as_str())
                            .or(citation["document_id"].as_str())
                            .unwrap_or(""),
                        crate::cli::place(citation)
                    );
                }
            }
        }
        match self.finish.as_deref() {
            Some("stop") | Some("budget") => Ok(()),
            finish => {
                let (code, message) = self.errors.pop().unwrap_or_else(|| {
                    (
                        finish.unwrap_or("incomplete").to_string(),
                        "the run did not finish with an answer".to_string(),
                    )
                });
                Err(CliError::Other(anyhow::anyhow!(
                    "the run ended without an answer ({code}): {message}"
                )))
            }
        }
    }
}
