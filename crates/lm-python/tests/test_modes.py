"""draft= (speculative decoding), num_beams= (beam search) and a list of prompts (the batch), each
held to the plain greedy loop and to numpy's log-softmax of the model's logits."""

import numpy as np
import pytest

import lm

# A prompt that repeats itself, so prompt lookup has matches to draft from.
REPEATING = "one two three four, one two three four, one two three four, one two"


def log_softmax_of(model, prompt_ids, ids):
    """ln p(ids[i] | prompt, ids[:i]) from the logits, computed by numpy."""
    rows = model.logits(prompt_ids + ids)[len(prompt_ids) - 1 : -1].astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    return rows[np.arange(len(ids)), ids]


@pytest.mark.parametrize("draft", ["prompt-lookup", "model", "path"])
def test_a_draft_gives_the_plain_greedy_ids(model, smollm2_path, no_end, draft):
    draft = {"prompt-lookup": "prompt-lookup", "model": model, "path": str(smollm2_path)}[draft]
    settings = dict(max_new_tokens=16, temperature=0, logit_bias=no_end)
    plain = model.generate(REPEATING, **settings)
    fast = model.generate(REPEATING, draft=draft, **settings)
    assert fast.ids == plain.ids and fast.text == plain.text
    np.testing.assert_allclose(fast.logprobs, plain.logprobs, rtol=0, atol=1e-4)
    streamed = "".join(model.generate(REPEATING, draft=draft, stream=True, **settings))
    assert streamed == plain.text


def test_a_bad_draft_is_refused(model):
    with pytest.raises(lm.InvalidArgument, match="draft"):
        model.generate("Hi", draft=3)
    with pytest.raises(lm.ModelFileError, match="not found"):
        model.generate("Hi", draft="no-such-draft.gguf")


def test_one_beam_is_greedy_and_beams_carry_the_models_logprobs(model, no_end):
    prompt = "The capital of France is"
    greedy = model.generate(prompt, max_new_tokens=8, temperature=0, logit_bias=no_end)
    one = model.generate(prompt, max_new_tokens=8, num_beams=1, length_penalty=0.0, logit_bias=no_end)
    assert one.ids == greedy.ids and one.text == greedy.text
    best = model.generate(prompt, max_new_tokens=8, num_beams=4, logit_bias=no_end, logprobs=2)
    assert len(best.ids) == 8 and best.stop_reason == "max_new_tokens" and not best.finished
    assert best.text == model.detokenize(best.ids)
    want = log_softmax_of(model, best.prompt_ids, best.ids)
    np.testing.assert_allclose(best.logprobs, want, rtol=0, atol=1e-4)
    assert [len(top) for top in best.top_logprobs] == [2] * 8
    with pytest.raises(lm.InvalidArgument, match="num_beams"):
        model.generate(prompt, num_beams=2, stream=True)
    with pytest.raises(lm.InvalidArgument, match="length_penalty needs num_beams"):
        model.generate(prompt, length_penalty=1.0)


def test_a_batch_gives_each_prompts_own_ids(model, no_end):
    prompts = ["The capital of France is", "Once upon a time", model.tokenize("1, 2, 3,")]
    settings = dict(max_new_tokens=6, temperature=0, logit_bias=no_end)
    batch = model.generate(prompts, **settings)
    assert isinstance(batch, list) and len(batch) == 3
    for prompt, run in zip(prompts, batch):
        alone = model.generate(prompt, **settings)
        assert run.ids == alone.ids and run.text == alone.text
        np.testing.assert_allclose(run.logprobs, alone.logprobs, rtol=0, atol=1e-4)
    with pytest.raises(lm.InvalidArgument, match="batch"):
        model.generate(prompts, stream=True)
