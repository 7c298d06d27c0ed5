//! lm-serve inside an application of your own: the OpenAI-compatible routes
//! from `lm_serve::router`, mounted under `/llm` beside the application's
//! own route in one axum app, served on a free port; one chat request to
//! `/llm/v1/chat/completions` with SmolLM2, its answer printed, and one
//! `/llm/v1/embeddings` request (the same weights, mean-pooled), then exit.
//! `cargo run -p lm-serve --example mount_router`; without SmolLM2 it says
//! "skipped: ..." naming the command that fetches it and exits 0 (CI runs
//! every example, the model or not).

use std::error::Error;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use lm::lm_model::catalog::SMOLLM2;

fn main() -> ExitCode {
    let Err(error) = run() else {
        return ExitCode::SUCCESS;
    };
    eprintln!("error: {}", lm::lm_core::error_chain(&*error));
    ExitCode::FAILURE
}

fn run() -> Result<(), Box<dyn Error>> {
    let path = match SMOLLM2.path() {
        Ok(path) => path,
        Err(error) => {
            eprintln!("skipped: {error}"); // it names the fetch command
            return Ok(());
        }
    };
    let lm::GgufModel { decoder, text } = lm::load_gguf(&path)?;
    let config = lm_serve::ServeConfig {
        model_name: "smollm2".into(),
        parallel: 1,
        ..lm_serve::ServeConfig::default()
    };
    let decoder = Arc::new(decoder);
    // The handle keeps the scheduler running: hold it while serving.
    let (llm, scheduler) = lm_serve::router(Arc::clone(&decoder), Arc::new(text), config)?;
    scheduler.serve_embeddings(lm::Embedder::new(decoder, lm::Pooling::Mean));
    let app = Router::new()
        .route("/", get(|| async { "the application's own page" }))
        .nest("/llm", llm);

    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    runtime.spawn(async move { axum::serve(listener, app).await });
    println!("serving on http://{addr}, the model under /llm");

    let chat = serde_json::json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is 2 plus 2?"}],
        "max_tokens": 16,
        "temperature": 0,
    });
    let answer = post(addr, "/llm/v1/chat/completions", &chat)?;
    let content = &answer["choices"][0]["message"]["content"];
    println!("answer: {}", content.as_str().ok_or("no message content")?);
    let input = serde_json::json!({"model": "smollm2", "input": "The cat sat on the mat."});
    let embedding = post(addr, "/llm/v1/embeddings", &input)?;
    let vector = embedding["data"][0]["embedding"]
        .as_array()
        .ok_or("no embedding")?;
    let norm: f64 = vector
        .iter()
        .filter_map(|x| x.as_f64())
        .map(|x| x * x)
        .sum();
    println!(
        "embedding: {} numbers, length {:.6}",
        vector.len(),
        norm.sqrt()
    );
    Ok(())
}

/// One JSON request over a plain socket (HTTP/1.1, the connection closed
/// after); the answer's JSON, or an error naming a status other than 200.
fn post(
    addr: std::net::SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, Box<dyn Error>> {
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, json) = response.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(format!("{path}: {status}: {json}").into());
    }
    println!("POST {path} -> {status}");
    Ok(serde_json::from_str(json)?)
}
