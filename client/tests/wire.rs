//! The client against a real HTTP peer on 127.0.0.1: a socket that records the request it got
//! and answers with fixed bytes (what the node's error and event-stream answers look like on
//! the wire).

use std::time::Duration;

use serde_json::Value;
use sift_client::{Client, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Serves one connection: reads the request head, then writes `pieces` one by one (with a
/// pause between them, so each is its own read on the client side). Gives the request head.
async fn serve_once(pieces: Vec<Vec<u8>>) -> (String, oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (sent, head) = oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the client closed before sending its request");
            request.extend_from_slice(&buffer[..n]);
        }
        let _ = sent.send(String::from_utf8_lossy(&request).to_string());
        for piece in pieces {
            socket.write_all(&piece).await.unwrap();
            socket.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let _ = socket.shutdown().await;
    });
    (base, head)
}

fn response(status: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn the_api_key_goes_as_a_bearer_token_and_errors_are_parsed() {
    let body = r#"{"error": {"code": "too_many_kbs", "message": "at most 1000 knowledge bases"}}"#;
    let (base, head) = serve_once(vec![response("409 Conflict", "retry-after: 2\r\n", body)]).await;
    let client = Client::new(&base, Some("s3cret".into()));
    let error = client
        .create_kb::<Value>(&serde_json::json!({ "name": "a b" }))
        .await
        .unwrap_err();
    let head = head.await.unwrap().to_ascii_lowercase();
    assert!(head.starts_with("post /v1/kbs http/1.1"), "{head}");
    assert!(head.contains("authorization: bearer s3cret\r\n"), "{head}");
    let api = error.api().expect("an API error");
    assert_eq!(api.status.as_u16(), 409);
    assert_eq!(api.code, "too_many_kbs");
    assert_eq!(api.message, "at most 1000 knowledge bases");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(
        error.to_string(),
        format!(
            "POST {base}/v1/kbs -> HTTP 409 Conflict [too_many_kbs]: at most 1000 knowledge bases"
        )
    );
}

#[tokio::test]
async fn without_a_key_no_authorization_is_sent_and_answers_decode() {
    let (base, head) = serve_once(vec![response("200 OK", "", r#"{"id": "k1"}"#)]).await;
    let client = Client::new(&base, None);
    let kb: Value = client.get_kb("sci fact").await.unwrap();
    assert_eq!(kb["id"], "k1");
    let head = head.await.unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with("get /v1/kbs/sci%20fact http/1.1"),
        "{head}"
    );
    assert!(!head.contains("authorization"), "{head}");
}

#[tokio::test]
async fn an_event_stream_read_in_pieces_arrives_whole() {
    let mut pieces = vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec(),
    ];
    let events = "id: 7\nevent: delta\ndata: {\"text\":\"中\"}\n\nid: 8\nevent: done\ndata: {}\n\n";
    let bytes = events.as_bytes();
    let zhong = bytes.windows(3).position(|w| w == "中".as_bytes()).unwrap();
    // The first read ends inside "中", the second inside the next event.
    pieces.push(bytes[..zhong + 1].to_vec());
    pieces.push(bytes[zhong + 1..zhong + 20].to_vec());
    pieces.push(bytes[zhong + 20..].to_vec());
    let (base, _head) = serve_once(pieces).await;
    let client = Client::new(&base, None);
    let mut stream = client.ask("s1", "q").await.unwrap();
    assert!(sift_client::is_event_stream(stream.headers()));
    let first = stream.next_event().await.unwrap().unwrap();
    assert_eq!(first.id.as_deref(), Some("7"));
    assert_eq!(first.event, "delta");
    assert_eq!(first.json()["text"], "中");
    let second = stream.next_event().await.unwrap().unwrap();
    assert_eq!(
        (second.id.as_deref(), second.event.as_str()),
        (Some("8"), "done")
    );
    assert!(stream.next_event().await.is_none());
}

#[tokio::test]
async fn an_unreachable_node_is_a_transport_error_with_its_cause() {
    // A port nobody listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("http://127.0.0.1:{port}"), None);
    let error = client.list_kbs::<Value>(100, None).await.unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
    assert!(error.is_transient());
    let cause = sift_client::render_error(error.transport().unwrap());
    // reqwest's own message only names the URL; the chain says what happened.
    assert!(!cause.contains("error sending request"), "{cause}");
    assert!(cause.to_lowercase().contains("connect"), "{cause}");
}
