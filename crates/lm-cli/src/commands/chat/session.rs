//! `chat --session FILE` (llama.cpp's `--prompt-cache`): the conversation
//! and the KV state that read it, saved after every reply and read back by
//! the next `chat --session FILE`, whose first reply then reads only the
//! new message's tokens.
//!
//! ```text
//! "LMCHATSS"  version (u32)  conversation length (u32)
//! conversation: JSON, as /save writes it
//! the state: lm-model's state file (the model's fingerprint, the tokens
//!            read, the KV cache, a checksum)
//! ```
//!
//! The file is replaced atomically (a temporary file beside it, synced,
//! renamed). A file that is not a session, or one of another model or KV
//! precision, cut short or damaged, is refused with a note: the chat starts
//! empty and does not write over it. A directory, a device or a FIFO is an
//! error before the model runs.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lm_core::{SequenceState, TokenId};
use lm_decode::PrefixCache;
use lm_model::ModelFingerprint;
use lm_serve::SavedState;

use super::conversation::{Conversation, MAX_CONVERSATION_BYTES};
use crate::files::{self, OutputFile};

/// A session file's first bytes.
const MAGIC: [u8; 8] = *b"LMCHATSS";
/// Its format version.
const VERSION: u32 = 1;

/// A chat read back from its session file.
pub struct Resumed<S> {
    pub conversation: Conversation,
    /// Replies generated before (each reply draws from its own stream of
    /// the seed: the next is stream `n_replies`).
    pub n_replies: usize,
    /// The tokens the state read, and the state.
    pub tokens: Vec<TokenId>,
    pub state: S,
}

/// What a session file holds besides the state.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    conversation: Conversation,
    n_replies: usize,
}

/// Saves a chat after each reply, without naming the model's state type.
pub trait SaveSession<S> {
    /// Writes the conversation and the state `cache` keeps.
    fn save(&self, conversation: &Conversation, n_replies: usize, cache: &mut PrefixCache<S>);
}

/// The session file of a chat.
#[derive(Debug)]
pub struct SessionFile {
    path: PathBuf,
    model: ModelFingerprint,
    /// Set when the file there was refused: it is left as it was.
    keep_off: bool,
}

impl SessionFile {
    /// The session at `path` for the model of fingerprint `model`; a
    /// directory, a device or a FIFO at `path` is refused.
    pub fn new(path: &Path, model: ModelFingerprint) -> Result<Self> {
        if path.symlink_metadata().is_ok() {
            files::open_input(path, files::Input::File)?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            model,
            keep_off: false,
        })
    }

    /// Reads the saved chat into `fresh`, a new state of the model: `None`
    /// when there is no file yet, or when it is refused (with a note on
    /// stderr; the file is then left alone).
    pub fn resume<S: SavedState>(&mut self, fresh: S) -> Option<Resumed<S>> {
        if self.path.symlink_metadata().is_err() {
            return None;
        }
        match self.read(fresh) {
            Ok(resumed) => {
                eprintln!(
                    "(resumed {} messages from {})",
                    resumed.conversation.messages.len(),
                    self.path.display()
                );
                Some(resumed)
            }
            Err(error) => {
                eprintln!(
                    "note: {}: not resumed, the chat starts empty and will not be saved over it: {error:#}",
                    self.path.display()
                );
                self.keep_off = true;
                None
            }
        }
    }

    fn read<S: SavedState>(&self, mut state: S) -> Result<Resumed<S>> {
        let file = files::open_input(&self.path, files::Input::File)?;
        let len = file.metadata()?.len();
        let mut r = std::io::BufReader::new(file);
        let mut head = [0u8; 16];
        anyhow::ensure!(len >= 16, "not a chat session file (too short)");
        r.read_exact(&mut head)?;
        anyhow::ensure!(head[..8] == MAGIC, "not a chat session file");
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        anyhow::ensure!(
            version == VERSION,
            "chat session format version {version}, this build reads version {VERSION}"
        );
        let json_len = u64::from(u32::from_le_bytes([head[12], head[13], head[14], head[15]]));
        anyhow::ensure!(
            json_len <= MAX_CONVERSATION_BYTES && 16 + json_len <= len,
            "the session file is truncated or corrupt: a conversation of {json_len} bytes in a file of {len}"
        );
        let mut json = vec![0; json_len as usize];
        r.read_exact(&mut json)?;
        let saved: Saved = serde_json::from_slice(&json).context("the saved conversation")?;
        let tokens = state.read_state(&mut r, len - 16 - json_len, self.model)?;
        Ok(Resumed {
            conversation: saved.conversation,
            n_replies: saved.n_replies,
            tokens,
            state,
        })
    }

    fn write<S: SavedState>(
        &self,
        conversation: &Conversation,
        n_replies: usize,
        tokens: &[TokenId],
        state: &S,
    ) -> Result<()> {
        let json = serde_json::to_vec(&Saved {
            conversation: conversation.clone(),
            n_replies,
        })?;
        let json_len = u32::try_from(json.len()).context("the conversation is too long to save")?;
        let mut state_error = None;
        let written = OutputFile::create(&self.path, false)?.write(|w| {
            w.write_all(&MAGIC)?;
            w.write_all(&VERSION.to_le_bytes())?;
            w.write_all(&json_len.to_le_bytes())?;
            w.write_all(&json)?;
            state.write_state(w, self.model, tokens).map_err(|error| {
                let message = error.to_string();
                state_error = Some(error);
                std::io::Error::other(message)
            })
        });
        if let Some(error) = state_error {
            return Err(error.into());
        }
        Ok(written?)
    }
}

impl<S: SavedState + SequenceState> SaveSession<S> for SessionFile {
    fn save(&self, conversation: &Conversation, n_replies: usize, cache: &mut PrefixCache<S>) {
        if self.keep_off {
            return;
        }
        let Some(tokens) = cache.kept().first().map(|tokens| tokens.to_vec()) else {
            return;
        };
        let Some((state, _)) = cache.longest_prefix(&tokens) else {
            return;
        };
        if let Err(error) = self.write(conversation, n_replies, &tokens, &state) {
            eprintln!(
                "note: the session was not saved to {}: {error:#}",
                self.path.display()
            );
        }
    }
}
