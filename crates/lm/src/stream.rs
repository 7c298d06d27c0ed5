//! A generation as an iterator of text pieces ([`Stream`]), for a caller
//! that pulls (a Python iterator, an async response body) rather than
//! being called back.
//!
//! lm-decode's loop calls its hook; to turn that inside out, the loop runs
//! on a thread of its own ([`GgufModel::generate_with`] there) and hands
//! each non-empty piece over a bounded channel. The consumer controls the
//! run: a stream that is cancelled or dropped stops the model at its next
//! step, and one that is not read stops it once the channel is full.
//!
//! ```text
//! caller thread                      generation thread
//! Stream::next() <── piece ─ channel ─ on_piece(step.text)   (blocks when full)
//! drop / cancel() ── flag ─────────> Break at the next step  ─> Completion
//! Stream::finish() <── join ─────────────────────────────────┘
//! ```

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::completion::Completion;
use crate::error::Error;
use crate::gguf::GgufModel;
use crate::options::{Options, Prompt};

/// Pieces the generation thread may run ahead of the consumer.
const AHEAD: usize = 64;

/// A running generation whose text pieces are read as an iterator
/// ([`GgufModel::stream`]). The pieces (never empty) join to the
/// completion's text; the iterator ends when the run does, and
/// [`Stream::finish`] then gives the [`Completion`] or the run's error.
#[derive(Debug)]
pub struct Stream {
    pieces: Option<Receiver<String>>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Completion, Error>>>,
}

impl GgufModel {
    /// Starts [`GgufModel::generate_with`] on a thread of its own and
    /// returns its pieces as an iterator. The prompt is tokenized and the
    /// options checked here, so a bad input fails this call, not the
    /// stream.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use lm::prelude::*;
    /// let model = Arc::new(lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?);
    /// let mut stream = Arc::clone(&model).stream("Once upon a time", &Options::default())?;
    /// for piece in stream.by_ref().take(3) {
    ///     print!("{piece}");
    /// }
    /// stream.cancel(); // the model stops at its next step
    /// let completion = stream.finish()?;
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn stream<'p>(
        self: Arc<Self>,
        prompt: impl Into<Prompt<'p>>,
        options: &Options,
    ) -> Result<Stream, Error> {
        let ids = self.prompt_ids(prompt)?;
        let config = self.generation_config(options)?;
        let draft = options.draft.clone();
        let (sender, pieces) = sync_channel(AHEAD);
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancel);
        let thread = std::thread::Builder::new()
            .name("lm-stream".into())
            .spawn(move || {
                self.run(&ids, &config, draft.as_ref(), |piece| {
                    forward(&sender, &flag, piece)
                })
            })
            .map_err(Error::Thread)?;
        Ok(Stream {
            pieces: Some(pieces),
            cancel,
            thread: Some(thread),
        })
    }
}

/// Hands `piece` to the consumer; `Break` once the stream is cancelled or
/// its consumer gone.
fn forward(sender: &SyncSender<String>, cancel: &AtomicBool, piece: &str) -> ControlFlow<()> {
    if cancel.load(Ordering::Relaxed) {
        return ControlFlow::Break(());
    }
    if !piece.is_empty() && sender.send(piece.to_owned()).is_err() {
        return ControlFlow::Break(());
    }
    ControlFlow::Continue(())
}

impl Stream {
    /// Asks the run to stop at its next step ([`lm_decode::StopReason::Cancelled`]);
    /// the pieces already made can still be read.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Waits for the run to end (pieces not read are dropped) and gives its
    /// [`Completion`], or its error.
    pub fn finish(mut self) -> Result<Completion, Error> {
        if let Some(pieces) = &self.pieces {
            // Read to the end, so the thread never waits on a full channel.
            for _ in pieces.iter() {}
        }
        self.join().expect("the thread is joined once")
    }

    /// Joins the generation thread (once), passing its panic on.
    fn join(&mut self) -> Option<Result<Completion, Error>> {
        let thread = self.thread.take()?;
        Some(
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    }
}

impl Iterator for Stream {
    type Item = String;

    /// The next piece of text; `None` once the run has ended.
    fn next(&mut self) -> Option<String> {
        self.pieces.as_ref()?.recv().ok()
    }
}

impl Drop for Stream {
    /// Stops the run at its next step and waits for it.
    fn drop(&mut self) {
        self.cancel();
        // Dropping the receiver wakes a thread waiting on a full channel.
        self.pieces = None;
        if !std::thread::panicking() {
            let _ = self.join();
        }
    }
}
