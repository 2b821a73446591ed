//! `sift ask KB "question"`: creates a session over the KB(s), asks, and renders the run's
//! event stream: thoughts dimmed, tool calls and their results, then the answer and its
//! numbered sources. Exits non-zero when the run ends in an error (or is stopped).

use std::io::{IsTerminal, Write};

use serde_json::{Value, json};

use crate::cli::{CliError, Client};

const DIM: &str = "\x1b[2m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

pub async fn ask(
    client: &Client,
    kbs: &[String],
    question: &str,
    agent: Option<&str>,
    raw: bool,
) -> Result<(), CliError> {
    let mut body = json!({ "kbs": kbs });
    if let Some(agent) = agent {
        body["agent"] = json!(agent);
    }
    let session = client.post_json("/v1/sessions", &body).await?;
    let session_id = session["id"].as_str().unwrap_or_default().to_string();
    let response = client
        .post_stream(
            &format!("/v1/sessions/{session_id}/messages"),
            &json!({ "content": question }),
        )
        .await?;
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
    let mut response = response;
    let mut buffer = String::new();
    loop {
        while let Some(at) = buffer.find("\n\n") {
            let block: String = buffer[..at].to_string();
            buffer.drain(..at + 2);
            if let Some((name, data)) = parse_block(&block) {
                renderer.event(&name, &data);
            }
        }
        match response.chunk().await {
            Ok(Some(bytes)) => {
                buffer.push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"))
            }
            Ok(None) => break,
            Err(error) => return Err(CliError::Unreachable(format!("the stream broke: {error}"))),
        }
    }
    renderer.finish()
}

fn parse_block(block: &str) -> Option<(String, Value)> {
    let mut name = "message".to_string();
    let mut data = String::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            name = value.trim().to_string();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    if data.is_empty() {
        return None;
    }
    Some((
        name,
        serde_json::from_str(&data).unwrap_or(Value::String(data)),
    ))
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
                    let span = &citation["span"];
                    println!(
                        "  [{}] {} ({}, chars {}–{})",
                        citation["n"],
                        citation["document_title"].as_str().unwrap_or(""),
                        citation["external_id"]
                            .as_str()
                            .or(citation["document_id"].as_str())
                            .unwrap_or(""),
                        span[0],
                        span[1]
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
