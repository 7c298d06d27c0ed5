//! A request's answer, shaped from its choices' events: the whole
//! response body (`Answer::whole`) or server-sent events
//! (`Answer::stream`), for completions and chat, with logprobs, `echo`,
//! `lm_trace`, reasoning split off and tool calls read from the reply.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use lm_core::TokenId;
use lm_decode::{Candidate, StopReason};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::echo::Echo;
use crate::error::ApiError;
use crate::reasoning::{self, ThinkSplitter, Thinking, content};
use crate::routes::{App, InFlight, Kind};
use crate::scheduler::Event;
use crate::tools::{Call, CallDelta, CallSplitter, ToolFormat};

/// One choice as it ends up.
#[derive(Debug, Default)]
pub(crate) struct Choice {
    text: String,
    logprobs: Vec<Value>,
    finish_reason: Option<&'static str>,
    n_prompt: usize,
    n_generated: usize,
    /// Why the choice has no answer: the request fails with it.
    error: Option<ApiError>,
    /// Characters of text before each token, for completions' `text_offset`.
    offset: usize,
    /// With `lm_trace`: one entry per token (see `trace.rs`).
    trace: Vec<Value>,
    /// A thinking template's reply: `text` is its content alone.
    thinking: Option<ThinkSplitter>,
}

/// OpenAI's name for why a choice ended: a `response_format` output
/// that is complete stops as an end token does.
fn finish_reason(reason: &StopReason) -> &'static str {
    match reason {
        StopReason::MaxNewTokens | StopReason::ContextBound => "length",
        StopReason::ConstraintComplete => "stop",
        _ => "stop",
    }
}

/// Shapes a request's events into its answer.
pub(crate) struct Answer {
    pub(crate) app: Arc<App>,
    pub(crate) kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) n: usize,
    pub(crate) logprobs: Option<usize>,
    /// `lm_trace`: each choice carries its tokens' trace entries.
    pub(crate) trace: bool,
    /// How tool calls are written, when the request offers tools: the
    /// reply is read into `tool_calls`.
    pub(crate) tool_format: Option<&'static ToolFormat>,
    /// The calls are enforced by a grammar: a stream sends their arguments
    /// as they are written.
    pub(crate) tools_enforced: bool,
    /// `echo`: the prompt every choice starts with.
    pub(crate) echo: Option<Echo>,
    /// Whether replies are split into reasoning and content.
    pub(crate) thinking: Option<Thinking>,
    /// Held until the answer is sent or dropped.
    pub(crate) _in_flight: InFlight,
}

impl Answer {
    /// A choice before its first event: empty, or starting with the echo.
    fn new_choice(&self) -> Choice {
        match &self.echo {
            None => Choice {
                thinking: self.thinking.map(ThinkSplitter::new),
                ..Choice::default()
            },
            Some(echo) => Choice {
                text: echo.text.clone(),
                logprobs: echo.entries.clone(),
                offset: echo.text.chars().count(),
                ..Choice::default()
            },
        }
    }

    /// The first chunk of each choice of a stream with `echo`: the prompt
    /// (and its logprobs), as vLLM streams it.
    fn echo_chunks(&self) -> std::collections::VecDeque<Value> {
        let Some(echo) = &self.echo else {
            return std::collections::VecDeque::new();
        };
        (0..self.n)
            .map(|index| {
                let mut chunk = self.chunk(index, &echo.text, None, None, false);
                if self.logprobs.is_some() {
                    chunk["choices"][0]["logprobs"] = Self::completion_logprobs(&echo.entries);
                }
                chunk
            })
            .collect()
    }

    /// The `logprobs` entry of one token in the endpoint's shape.
    fn logprob_entry(
        &self,
        token: TokenId,
        logprob: f64,
        top: &[Candidate],
        offset: usize,
    ) -> Value {
        let text = self.app.text.token_text(token);
        // The loop records more candidates for `lm_trace` than asked here.
        let top = &top[..top.len().min(self.logprobs.unwrap_or(0))];
        match self.kind {
            Kind::Chat => json!({
                "token": text,
                "logprob": logprob,
                "bytes": text.as_bytes(),
                "top_logprobs": top.iter().map(|c| {
                    let t = self.app.text.token_text(c.token);
                    json!({"token": t, "logprob": c.logprob, "bytes": t.as_bytes()})
                }).collect::<Vec<_>>(),
            }),
            Kind::Completion => {
                let top: serde_json::Map<String, Value> = top
                    .iter()
                    .map(|c| (self.app.text.token_text(c.token), json!(c.logprob)))
                    .collect();
                json!({"token": text, "logprob": logprob, "top": top, "offset": offset})
            }
        }
    }

    /// Completions' `logprobs` object from per-token entries.
    fn completion_logprobs(entries: &[Value]) -> Value {
        json!({
            "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
            "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
            "top_logprobs": entries.iter().map(|e| e["top"].clone()).collect::<Vec<_>>(),
            "text_offset": entries.iter().map(|e| e["offset"].clone()).collect::<Vec<_>>(),
        })
    }

    fn logprobs_value(&self, entries: &[Value]) -> Value {
        match (self.logprobs, self.kind) {
            (None, _) => Value::Null,
            (Some(_), Kind::Chat) => json!({ "content": entries }),
            (Some(_), Kind::Completion) => Self::completion_logprobs(entries),
        }
    }

    /// Applies one event to its choice; returns the new text and the
    /// logprob and trace entries it adds, if any.
    fn apply(&self, choice: &mut Choice, event: Event) -> (String, Option<Value>, Option<Value>) {
        match event {
            Event::Token {
                token,
                logprob,
                top,
                text,
                trace,
            } => {
                let entry = (self.logprobs.is_some() && !self.app.end_tokens.contains(&token))
                    .then(|| self.logprob_entry(token, logprob, &top, choice.offset));
                if let Some(entry) = &entry {
                    choice.logprobs.push(entry.clone());
                }
                let traced = trace.map(|t| t.to_json(&*self.app.text, token, logprob, &top));
                if let Some(traced) = &traced {
                    choice.trace.push(traced.clone());
                }
                choice.offset += text.chars().count();
                let text = content(&mut choice.thinking, text, false);
                choice.text.push_str(&text);
                (text, entry, traced)
            }
            Event::Done {
                stop_reason: StopReason::Cancelled,
                n_prompt,
                n_generated,
                ..
            } => {
                // Only shutdown (or the client hanging up) cancels: the text
                // is truncated, and neither "stop" nor "length" says so.
                choice.error = Some(
                    ApiError::status(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the server shut down before this answer was finished \
                             ({n_generated} tokens generated); retry on another server"
                        ),
                    )
                    .with_code("server_shutting_down")
                    .retry_after(5),
                );
                choice.n_prompt = n_prompt;
                choice.n_generated = n_generated;
                (String::new(), None, None)
            }
            Event::Done {
                text,
                stop_reason,
                n_prompt,
                n_generated,
            } => {
                let text = content(&mut choice.thinking, text, true);
                choice.text.push_str(&text);
                choice.finish_reason = Some(finish_reason(&stop_reason));
                choice.n_prompt = n_prompt;
                choice.n_generated = n_generated;
                (text, None, None)
            }
            Event::Failed(message) => {
                choice.error = Some(ApiError::status(StatusCode::BAD_REQUEST, message));
                choice.finish_reason = Some("stop");
                (String::new(), None, None)
            }
        }
    }

    fn usage(choices: &[Choice]) -> Value {
        let prompt = choices.first().map_or(0, |c| c.n_prompt);
        let completion: usize = choices.iter().map(|c| c.n_generated).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// Waits for every choice and answers in one JSON body.
    pub(crate) async fn whole(self, mut receiver: UnboundedReceiver<(usize, Event)>) -> Response {
        let mut choices: Vec<Choice> = (0..self.n).map(|_| self.new_choice()).collect();
        let mut n_open = self.n;
        while n_open > 0 {
            let Some((index, event)) = receiver.recv().await else {
                break;
            };
            let ends = !matches!(event, Event::Token { .. });
            self.apply(&mut choices[index], event);
            n_open -= usize::from(ends);
        }
        if let Some(error) = choices.iter().find_map(|c| c.error.clone()) {
            return error.into_response();
        }
        if choices.iter().any(|c| c.finish_reason.is_none()) {
            return ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "a generation ended without an answer",
            )
            .into_response();
        }
        let body_choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(index, c)| match self.kind {
                Kind::Completion => json!({
                    "index": index,
                    "text": c.text,
                    "logprobs": self.logprobs_value(&c.logprobs),
                    "finish_reason": c.finish_reason,
                }),
                Kind::Chat => {
                    let calls = self.tool_format.and_then(|f| f.parse(&c.text));
                    let (mut message, finish_reason) = match calls {
                        Some((content, calls)) => (
                            json!({
                                "role": "assistant",
                                "content": (!content.is_empty()).then_some(content),
                                "tool_calls": self.tool_calls_json(&calls),
                            }),
                            // Cut by max_tokens after a complete call: "length".
                            c.finish_reason
                                .filter(|&r| r == "length")
                                .or(Some("tool_calls")),
                        ),
                        None => (
                            json!({"role": "assistant", "content": c.text}),
                            c.finish_reason,
                        ),
                    };
                    if let Some(r) = c.thinking.as_ref().and_then(ThinkSplitter::reasoning) {
                        message["reasoning_content"] = json!(r);
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": self.logprobs_value(&c.logprobs),
                        "finish_reason": finish_reason,
                    })
                }
            })
            .zip(&choices)
            .map(|(mut body, c)| {
                if self.trace {
                    body["lm_trace"] = json!(c.trace);
                }
                body
            })
            .collect();
        axum::Json(json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion" },
            "created": self.created,
            "model": self.app.model_id(),
            "choices": body_choices,
            "usage": Self::usage(&choices),
        }))
        .into_response()
    }

    /// `calls` as OpenAI's `tool_calls`, each with a fresh id.
    fn tool_calls_json(&self, calls: &[Call]) -> Vec<Value> {
        calls
            .iter()
            .map(|call| call.to_json(self.call_id()))
            .collect()
    }

    /// A new tool call id in the format's shape.
    fn call_id(&self) -> String {
        let salt = self.created ^ self.app.next_id.load(Ordering::Relaxed);
        self.tool_format
            .unwrap_or(&crate::tools::GENERIC)
            .call_id(salt)
    }

    /// The chunks of one streamed piece of a call, as OpenAI sends them:
    /// its opening (index, a fresh id, type, name, empty arguments), and a
    /// piece of its arguments.
    fn call_chunks(&self, index: usize, delta: &CallDelta) -> Vec<Value> {
        let with = |call: Value| {
            let mut chunk = self.chunk(index, "", None, None, false);
            chunk["choices"][0]["delta"] = json!({ "tool_calls": [call] });
            chunk
        };
        let mut chunks = Vec::with_capacity(2);
        if let Some(name) = &delta.name {
            chunks.push(with(json!({
                "index": delta.index, "id": self.call_id(), "type": "function",
                "function": {"name": name, "arguments": ""},
            })));
        }
        if !delta.arguments.is_empty() {
            chunks.push(with(json!({
                "index": delta.index, "function": {"arguments": delta.arguments},
            })));
        }
        chunks
    }

    /// One streamed chunk with one choice.
    fn chunk(
        &self,
        index: usize,
        text: &str,
        entry: Option<Value>,
        finish: Option<&str>,
        first: bool,
    ) -> Value {
        let logprobs = match entry {
            None => Value::Null,
            Some(entry) => self.logprobs_value(&[entry]),
        };
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = match (first, finish) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, Some(_)) if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion.chunk" },
            "created": self.created,
            "model": self.app.model_id(),
            "choices": [choice],
        })
    }

    /// Server-sent events: a chunk per token that adds text (or a logprob),
    /// a last chunk per choice with its `finish_reason`, the usage when
    /// asked, then `data: [DONE]`. Dropping the stream (the client went
    /// away) drops the receiver, which cancels the choices.
    pub(crate) fn stream(
        self,
        receiver: UnboundedReceiver<(usize, Event)>,
        include_usage: bool,
    ) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
        struct Progress {
            answer: Answer,
            receiver: UnboundedReceiver<(usize, Event)>,
            choices: Vec<Choice>,
            started: Vec<bool>,
            /// Per choice, when tools are offered: what is content and
            /// what is a call.
            splitters: Vec<Option<CallSplitter>>,
            /// Chunks to send before reading the next event.
            pending: std::collections::VecDeque<Value>,
            n_open: usize,
            include_usage: bool,
            /// 0: choices running, 1: usage sent (or skipped), 2: done.
            phase: u8,
        }
        let n = self.n;
        let progress = Progress {
            choices: (0..n).map(|_| self.new_choice()).collect(),
            started: vec![false; n],
            splitters: (0..n)
                .map(|_| {
                    self.tool_format
                        .map(|format| CallSplitter::new(format, self.tools_enforced))
                })
                .collect(),
            pending: self.echo_chunks(),
            n_open: n,
            receiver,
            include_usage,
            answer: self,
            phase: 0,
        };
        let stream = futures_util::stream::unfold(progress, |mut p| async move {
            loop {
                if let Some(chunk) = p.pending.pop_front() {
                    return Some((Ok(SseEvent::default().data(chunk.to_string())), p));
                }
                if p.phase == 0 && p.n_open == 0 {
                    p.phase = 1;
                    if p.include_usage {
                        let mut usage = p.answer.chunk(0, "", None, None, false);
                        usage["choices"] = json!([]);
                        usage["usage"] = Answer::usage(&p.choices);
                        return Some((Ok(SseEvent::default().data(usage.to_string())), p));
                    }
                }
                match p.phase {
                    1 => {
                        p.phase = 2;
                        return Some((Ok(SseEvent::default().data("[DONE]")), p));
                    }
                    2 => return None,
                    _ => {}
                }
                let Some((index, event)) = p.receiver.recv().await else {
                    p.n_open = 0;
                    continue;
                };
                let ends = !matches!(event, Event::Token { .. });
                let (mut text, entry, traced) = p.answer.apply(&mut p.choices[index], event);
                if ends {
                    p.n_open -= 1;
                    if let Some(error) = &p.choices[index].error {
                        let body = error.body();
                        return Some((Ok(SseEvent::default().data(body.to_string())), p));
                    }
                }
                let first = !p.started[index];
                let thinker = p.choices[index].thinking.as_mut();
                let reasoning = thinker.map(ThinkSplitter::take_fresh).unwrap_or_default();
                let mut calls = Vec::new();
                let mut made_calls = false;
                if let Some(splitter) = &mut p.splitters[index] {
                    let split = splitter.push(&text);
                    text = split.content;
                    calls = split.calls;
                }
                if ends && let Some(splitter) = p.splitters[index].take() {
                    let (split, made) = splitter.finish();
                    text.push_str(&split.content);
                    calls.extend(split.calls);
                    made_calls = made;
                }
                if !calls.is_empty() || made_calls {
                    // Content (and what comes with its token) first, then
                    // the pieces of calls, then the end.
                    let alone = text.is_empty() && entry.is_none() && traced.is_none() && !first;
                    let mut chunk = p.answer.chunk(index, &text, entry, None, first);
                    if alone {
                        p.pending.extend(reasoning::alone(chunk, &reasoning));
                    } else {
                        reasoning::add_to_chunk(&mut chunk, &reasoning);
                        if let Some(traced) = traced {
                            chunk["choices"][0]["lm_trace"] = json!([traced]);
                        }
                        p.pending.push_back(chunk);
                    }
                    p.started[index] = true;
                    for call in &calls {
                        p.pending.extend(p.answer.call_chunks(index, call));
                    }
                    if ends {
                        let finish = match p.choices[index].finish_reason {
                            // Cut by max_tokens after complete calls.
                            Some("length") => "length",
                            _ if made_calls => "tool_calls",
                            other => other.unwrap_or("stop"),
                        };
                        let mut last = p.answer.chunk(index, "", None, Some(finish), false);
                        last["choices"][0]["delta"] = json!({});
                        p.pending.push_back(last);
                    }
                    continue;
                }
                if text.is_empty()
                    && reasoning.is_empty()
                    && entry.is_none()
                    && traced.is_none()
                    && !ends
                    && !(first && p.answer.kind == Kind::Chat)
                {
                    continue;
                }
                p.started[index] = true;
                let finish = if ends {
                    p.choices[index].finish_reason
                } else {
                    None
                };
                let mut chunk = p.answer.chunk(index, &text, entry, finish, first);
                reasoning::add_to_chunk(&mut chunk, &reasoning);
                if let Some(traced) = traced {
                    chunk["choices"][0]["lm_trace"] = json!([traced]);
                }
                return Some((Ok(SseEvent::default().data(chunk.to_string())), p));
            }
        });
        Sse::new(stream)
    }
}
