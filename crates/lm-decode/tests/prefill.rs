//! Chunked prefill: the prompt read in chunks gives the same run as one
//! read, and a hook can stop between chunks before any token is chosen.

use crate::common::PrefixModel;
use std::num::NonZeroUsize;
use std::ops::ControlFlow;

use lm_core::{Counting, TokenId};
use lm_decode::{
    GenerationConfig, GenerationHook, SamplingConfig, Step, StopReason, generate, generate_many,
    generate_with_hook,
};

const PROMPT: [TokenId; 5] = [0, 1, 2, 3, 4];

fn config(chunk_len: Option<usize>) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 3,
        sampling: SamplingConfig {
            seed: 5,
            ..SamplingConfig::default()
        },
        prefill_chunk_len: chunk_len.and_then(NonZeroUsize::new),
        num_return_sequences: 2,
        ..GenerationConfig::default()
    }
}

/// Counts the chunks it sees and stops after `stop_after` of them.
struct StopAfterChunks {
    stop_after: usize,
    seen: Vec<(usize, usize)>,
    n_steps: usize,
}

impl GenerationHook for &mut StopAfterChunks {
    type Error = lm_decode::Error;

    fn on_step(&mut self, _step: &Step) -> Result<ControlFlow<()>, Self::Error> {
        self.n_steps += 1;
        Ok(ControlFlow::Continue(()))
    }

    fn after_prefill_chunk(
        &mut self,
        n_read: usize,
        n_prompt: usize,
    ) -> Result<ControlFlow<()>, Self::Error> {
        self.seen.push((n_read, n_prompt));
        Ok(if self.seen.len() == self.stop_after {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    }
}

#[test]
fn a_prompt_read_in_chunks_gives_the_same_run() {
    let whole = Counting::new(PrefixModel::new(7));
    let expected = generate(&whole, &PROMPT, &config(None), None).unwrap();
    assert_eq!(whole.calls(), vec![5, 1, 1]);
    let chunked = Counting::new(PrefixModel::new(7));
    let run = generate(&chunked, &PROMPT, &config(Some(2)), None).unwrap();
    assert_eq!(chunked.calls(), vec![2, 2, 1, 1, 1]);
    assert_eq!(run.tokens, expected.tokens);
    assert_eq!(run.steps, expected.steps);
    // Several outputs share one chunked prefill.
    let many = Counting::new(PrefixModel::new(7));
    let outputs = generate_many(&many, &PROMPT, &config(Some(2)), None).unwrap();
    assert_eq!(&many.calls()[..3], &[2, 2, 1]);
    assert_eq!(outputs[0].tokens, expected.tokens);
}

#[test]
fn a_hook_stops_between_prefill_chunks_before_any_token() {
    let model = Counting::new(PrefixModel::new(7));
    let mut hook = StopAfterChunks {
        stop_after: 1,
        seen: Vec::new(),
        n_steps: 0,
    };
    let run = generate_with_hook(&model, &PROMPT, &config(Some(2)), None, &mut hook).unwrap();
    assert_eq!(
        model.calls(),
        vec![2],
        "the rest of the prompt is never read"
    );
    assert_eq!(hook.seen, vec![(2, 5)]);
    assert_eq!(hook.n_steps, 0);
    assert_eq!(run.stop_reason, StopReason::Cancelled);
    assert!(run.tokens.is_empty() && run.steps.is_empty());
    assert_eq!(run.prompt, PROMPT);
    // Not stopped: every chunk is seen, the last with the whole prompt.
    let mut hook = StopAfterChunks {
        stop_after: 0,
        seen: Vec::new(),
        n_steps: 0,
    };
    let run = generate_with_hook(&model, &PROMPT, &config(Some(2)), None, &mut hook).unwrap();
    assert_eq!(hook.seen, vec![(2, 5), (4, 5), (5, 5)]);
    assert_eq!(hook.n_steps, 3);
    assert_eq!(run.stop_reason, StopReason::MaxNewTokens);
}
