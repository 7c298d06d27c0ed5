//! Limits and hostile clients: bad bodies, oversized bodies, missing keys,
//! a full queue, dropped connections, half-sent requests, many connections
//! at once; each gets a 4xx or is dropped, and the server keeps serving.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use lm_serve::ServeConfig;
use serde_json::json;

use crate::common::{TestServer, ToyText, gated, read_response, request, toy_model, wait_for};

fn still_serves(s: &TestServer) {
    let (status, body) = s.post(
        "/v1/completions",
        &json!({"prompt": "<start> the", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn malformed_bodies_get_400_and_huge_ones_413() {
    let s = TestServer::start(
        toy_model(),
        ToyText,
        ServeConfig {
            max_body_bytes: 64 * 1024,
            ..ServeConfig::default()
        },
    );
    for body in [
        &b"{not json"[..],
        b"",
        b"[]",
        b"\"text\"",
        b"{\"prompt\": \"<start>\", \"n\": 1e300}",
        &[0xff, 0xfe, 0x00][..],
    ] {
        let r = request(s.addr, "POST", "/v1/completions", &[], body);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
        assert!(r.json()["error"]["message"].is_string());
    }
    let big = vec![b' '; 10 << 20];
    let r = request(s.addr, "POST", "/v1/completions", &[], &big);
    assert_eq!(r.status, 413);
    let r = request(s.addr, "GET", "/v2/nothing", &[], b"");
    assert_eq!(r.status, 404);
    let r = request(s.addr, "GET", "/v1/completions", &[], b"");
    assert_eq!(r.status, 405);
    still_serves(&s);
}

#[test]
fn an_api_key_guards_everything_but_health() {
    let s = TestServer::start(
        toy_model(),
        ToyText,
        ServeConfig {
            api_key: Some("sesame".into()),
            ..ServeConfig::default()
        },
    );
    let body = json!({"prompt": "<start>", "max_tokens": 1}).to_string();
    let r = request(s.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer wrong")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 401);
    let r = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sesame")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(s.get("/metrics").status, 401);
    assert_eq!(s.get("/health").status, 200);
}

/// Opens a streaming request and reads its head and first event.
fn open_stream(addr: std::net::SocketAddr, max_tokens: u64) -> TcpStream {
    let body = json!({"prompt": "<start>", "max_tokens": max_tokens, "stream": true, "seed": 1,
                      "logit_bias": {"6": -100}})
    .to_string();
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    stream
}

#[test]
fn a_full_queue_is_429_with_retry_after_and_a_dropped_client_frees_its_slot() {
    // The model waits until the queue has been seen full: a fast toy could
    // otherwise finish the first request before the others arrive.
    let (gated, gate) = gated(toy_model());
    gate.close();
    let s = TestServer::start(
        gated,
        ToyText,
        ServeConfig {
            parallel: 1,
            queue_len: 1,
            ..ServeConfig::default()
        },
    );
    let running = open_stream(s.addr, 1000);
    wait_for("the first request to run", || {
        s.metric("lm_active_sequences") == 1.0
    });
    // The second waits in the queue (its own connection, answered later).
    let queued_addr = s.addr;
    let queued = std::thread::spawn(move || {
        let body = json!({"prompt": "<start> the", "max_tokens": 2, "temperature": 0}).to_string();
        request(queued_addr, "POST", "/v1/completions", &[], body.as_bytes()).status
    });
    wait_for("the second request to queue", || {
        s.metric("lm_queue_depth") == 1.0
    });
    let body = json!({"prompt": "<start>", "max_tokens": 2}).to_string();
    let r = request(s.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    // Hanging up cancels the running sequence; the queued one then runs.
    drop(running);
    gate.open();
    assert_eq!(queued.join().unwrap(), 200);
    wait_for("the slot to free", || {
        s.metric("lm_active_sequences") == 0.0
    });
    assert!(s.metric("lm_generation_tokens_total") < 1000.0);
    still_serves(&s);
}

#[test]
fn half_sent_requests_and_many_connections_do_not_stop_the_server() {
    let s = TestServer::start(toy_model(), ToyText, ServeConfig::default());
    // A client that sends half a request and goes silent, one that sends
    // less body than it announced, one that sends garbage.
    let mut silent = TcpStream::connect(s.addr).unwrap();
    silent
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut short = TcpStream::connect(s.addr).unwrap();
    short
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        .unwrap();
    let mut garbage = TcpStream::connect(s.addr).unwrap();
    garbage
        .write_all(b"\x00\x01\x02 not http at all\r\n\r\n")
        .unwrap();
    let mut reply = Vec::new();
    let _ = garbage.read_to_end(&mut reply);
    assert!(reply.is_empty() || String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 4"));
    still_serves(&s);
    // 200 connections at once, each asking for a token.
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..200)
            .map(|_| {
                let addr = s.addr;
                scope.spawn(move || {
                    let body = json!({"prompt": "<start>", "max_tokens": 1}).to_string();
                    let mut stream = TcpStream::connect(addr).unwrap();
                    write!(
                        stream,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                    read_response(&mut BufReader::new(stream)).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200));
    drop((silent, short));
    still_serves(&s);
}

#[test]
fn shutdown_lets_running_requests_finish_then_returns() {
    // The request waits at the gate until the server has been told to stop.
    let (gated, gate) = gated(toy_model());
    gate.close();
    let mut s = TestServer::start(
        gated,
        ToyText,
        ServeConfig {
            shutdown_grace: Duration::from_secs(30),
            ..ServeConfig::default()
        },
    );
    let addr = s.addr;
    let running = std::thread::spawn(move || {
        let body =
            json!({"prompt": "<start>", "max_tokens": 300, "logit_bias": {"6": -100}, "seed": 2})
                .to_string();
        request(addr, "POST", "/v1/completions", &[], body.as_bytes())
    });
    wait_for("the request to run", || {
        s.metric("lm_active_sequences") == 1.0
    });
    s.signal_stop();
    gate.open();
    s.stop().unwrap();
    let response = running.join().unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["usage"]["completion_tokens"], 300);
}

#[test]
fn shutdown_after_the_grace_cancels_what_still_runs() {
    let (gated, gate) = gated(toy_model());
    gate.close();
    let mut s = TestServer::start(
        gated,
        ToyText,
        ServeConfig {
            shutdown_grace: Duration::from_millis(200),
            ..ServeConfig::default()
        },
    );
    let stream = open_stream(s.addr, 1000);
    wait_for("the request to run", || {
        s.metric("lm_active_sequences") == 1.0
    });
    let started = Instant::now();
    s.signal_stop();
    gate.open();
    s.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(stream);
}
