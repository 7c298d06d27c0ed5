//! Several prompts at once, with a finished mask (lesson 001, "Different
//! sequences can finish at different times").
//!
//! Each round, every row still running chooses one token; rows that stopped
//! are no longer extended or fed. The mask's accounting is the lesson's:
//!
//! ```text
//! length   += !finished        (per row, before the round's choices count)
//! finished |= chosen is an end token
//! ```
//!
//! Row i draws from random stream `config.rng_stream + i`, so it gives exactly
//! the tokens [`crate::generate`] gives for its prompt with that stream.

use crate::error::Result;
use crate::generate::GenerationConfig;
use crate::row::{Row, prepare};
use crate::trace::Generation;
use lm_core::{Detokenize, LanguageModel, TokenId};

/// Which rows of a batch are finished and how many tokens each generated.
///
/// ```
/// use lm_decode::FinishedMask;
/// // Lesson 001: end token 0, three rounds of supplied choices.
/// let mut mask = FinishedMask::new(2);
/// for chosen in [[2, 1], [0, 3], [4, 0]] {
///     mask.record_round(&chosen, &[0]).unwrap();
/// }
/// assert_eq!(mask.lengths(), &[2, 3]);
/// assert_eq!(mask.finished(), &[true, true]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedMask {
    finished: Vec<bool>,
    lengths: Vec<usize>,
}

impl FinishedMask {
    /// `n_rows` rows, none finished, all of length 0.
    pub fn new(n_rows: usize) -> Self {
        Self {
            finished: vec![false; n_rows],
            lengths: vec![0; n_rows],
        }
    }

    /// Counts one round: every unfinished row grows by one token and finishes
    /// if its choice is an end token; the choices of finished rows are
    /// ignored. `chosen` has one entry per row.
    pub fn record_round(&mut self, chosen: &[TokenId], end_tokens: &[TokenId]) -> Result<()> {
        if chosen.len() != self.finished.len() {
            return Err(lm_core::Error::LengthMismatch {
                left: chosen.len(),
                right: self.finished.len(),
            }
            .into());
        }
        for ((finished, length), token) in
            self.finished.iter_mut().zip(&mut self.lengths).zip(chosen)
        {
            if !*finished {
                *length += 1;
                *finished = end_tokens.contains(token);
            }
        }
        Ok(())
    }

    /// Marks `row` finished for a reason other than an end token (a stop
    /// string or a limit); a row beyond the batch is ignored.
    pub fn finish(&mut self, row: usize) {
        if let Some(finished) = self.finished.get_mut(row) {
            *finished = true;
        }
    }

    /// Per row: no longer extended.
    pub fn finished(&self) -> &[bool] {
        &self.finished
    }

    /// Per row: tokens generated.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// True when every row is finished.
    pub fn all_finished(&self) -> bool {
        self.finished.iter().all(|&f| f)
    }
}

/// Generates for every prompt in `prompts`, feeding the rows still running
/// together through [`LanguageModel::forward_batch`]. Returns one
/// [`Generation`] per prompt, in order; `config.num_return_sequences` is not
/// used (repeat a prompt for several outputs).
///
/// ```
/// use lm_core::{LanguageModel, Prefix, Rows, TokenId};
/// use lm_decode::{generate_batch, GenerationConfig, SamplingConfig};
/// # struct Echo;
/// # impl LanguageModel for Echo {
/// #     type State = Prefix;
/// #     fn vocab_size(&self) -> usize { 3 }
/// #     fn context_length(&self) -> Option<usize> { None }
/// #     fn new_state(&self) -> Prefix { Prefix::default() }
/// #     fn forward(&self, s: &mut Prefix, t: &[TokenId], _r: Rows, l: &mut Vec<f32>) -> lm_core::Result<()> {
/// #         s.tokens.extend_from_slice(t);
/// #         let last = s.tokens[s.tokens.len() - 1] as usize;
/// #         l.clear();
/// #         l.extend((0..3).map(|i| if i == last { 1.0 } else { 0.0 }));
/// #         Ok(())
/// #     }
/// # }
/// // A model that repeats its last token, greedy, 2 new tokens.
/// let config = GenerationConfig { max_new_tokens: 2, sampling: SamplingConfig::greedy(), ..Default::default() };
/// let runs = generate_batch(&Echo, &[&[1], &[0, 2]], &config, None).unwrap();
/// assert_eq!(runs[0].tokens, vec![1, 1]);
/// assert_eq!(runs[1].tokens, vec![2, 2]);
/// ```
pub fn generate_batch<M: LanguageModel>(
    model: &M,
    prompts: &[&[TokenId]],
    config: &GenerationConfig,
    detokenizer: Option<&dyn Detokenize>,
) -> Result<Vec<Generation>> {
    let mut rows = Vec::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        let fitted = prepare(model, prompt, config, detokenizer)?;
        let rng_stream = config.rng_stream.wrapping_add(index as u64);
        rows.push(Row::new(model, fitted, config, detokenizer, rng_stream)?);
    }
    let mut mask = FinishedMask::new(rows.len());
    for (index, row) in rows.iter().enumerate() {
        if row.stop_reason.is_some() {
            mask.finish(index);
        }
    }
    // The running rows, their states and logits, kept in parallel.
    let running: Vec<usize> = (0..rows.len()).filter(|&i| !mask.finished()[i]).collect();
    let mut states: Vec<M::State> = running.iter().map(|_| model.new_state()).collect();
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); running.len()];
    let prompt_slices: Vec<&[TokenId]> = running
        .iter()
        .map(|&i| rows[i].history.as_slice())
        .collect();
    model.forward_batch(&mut states, &prompt_slices, &mut logits)?;
    run_together(model, &mut rows, running, states, logits, &mut mask)?;
    let generations: Vec<Generation> = rows.into_iter().map(Row::into_generation).collect();
    debug_assert!(
        generations
            .iter()
            .zip(mask.lengths())
            .all(|(g, &n)| g.tokens.len() == n)
    );
    Ok(generations)
}

/// Runs the rows `running` (indices into `rows`, each with its state and its
/// logits row after its history, in parallel vectors) to their ends: each
/// round every running row chooses a token ([`Row::advance`]), the stopped
/// ones leave, and the rest read their new tokens in one
/// [`LanguageModel::forward_batch`] (one pass over the weights for a
/// model with a multi-sequence step). Shared by [`generate_batch`] and
/// [`crate::generate_many`].
pub(crate) fn run_together<M: LanguageModel>(
    model: &M,
    rows: &mut [Row<'_>],
    mut running: Vec<usize>,
    mut states: Vec<M::State>,
    mut logits: Vec<Vec<f32>>,
    mask: &mut FinishedMask,
) -> Result<()> {
    let mut chosen: Vec<TokenId> = vec![0; rows.len()];
    let mut feed: Vec<[TokenId; 1]> = Vec::with_capacity(rows.len());
    while !running.is_empty() {
        for (slot, &row_idx) in running.iter().enumerate() {
            chosen[row_idx] = rows[row_idx].advance(&logits[slot])?.token;
        }
        let end_tokens = &rows[running[0]].config().end_tokens;
        mask.record_round(&chosen, end_tokens)?;
        let mut n_kept = 0;
        for slot in 0..running.len() {
            let row_idx = running[slot];
            if rows[row_idx].stop_reason.is_some() {
                mask.finish(row_idx);
                continue;
            }
            running.swap(n_kept, slot);
            states.swap(n_kept, slot);
            logits.swap(n_kept, slot);
            n_kept += 1;
        }
        running.truncate(n_kept);
        states.truncate(n_kept);
        logits.truncate(n_kept);
        if running.is_empty() {
            break;
        }
        feed.clear();
        feed.extend(running.iter().map(|&row_idx| [chosen[row_idx]]));
        let slices: Vec<&[TokenId]> = feed.iter().map(|token| token.as_slice()).collect();
        model.forward_batch(&mut states, &slices, &mut logits)?;
    }
    Ok(())
}
