"""generate, tokenize, logits and score against lm-cli's results and against numpy."""

import numpy as np
import pytest

import lm


def test_greedy_generation_is_lm_clis(model, expected):
    want = expected["generate"]
    got = model.generate(want["prompt"], max_new_tokens=8, temperature=0)
    assert got.prompt_ids == want["prompt_ids"]
    assert got.ids == want["ids"]
    assert got.text == want["text"]
    assert got.stop_reason == want["stop_reason"] == "max_new_tokens"
    assert not got.finished
    np.testing.assert_allclose(got.logprobs, want["logprobs"], rtol=0, atol=1e-5)
    # lm-cli prints the prompt, then the continuation, then a newline.
    assert want["prompt"] + str(got) + "\n" == want["printed"]


def test_ids_in_give_the_same_run_as_text(model, expected):
    want = expected["generate"]
    got = model.generate(want["prompt_ids"], max_new_tokens=8, temperature=0)
    assert got.ids == want["ids"]


def test_logits_give_generations_logprobs(model, expected):
    """Each step's logprob is the log-softmax of the logits row before it (computed here by numpy)."""
    want = expected["generate"]
    ids = want["prompt_ids"] + want["ids"]
    logits = model.logits(ids)
    assert logits.shape == (len(ids), model.vocab_size)
    assert logits.dtype == np.float32
    rows = logits[len(want["prompt_ids"]) - 1 : -1].astype(np.float64)
    log_softmax = rows - rows.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    chosen = log_softmax[np.arange(len(want["ids"])), want["ids"]]
    np.testing.assert_allclose(chosen, want["logprobs"], rtol=0, atol=1e-4)
    # Greedy: every chosen token is its row's argmax.
    assert list(rows.argmax(axis=1)) == want["ids"]


def test_score_is_lm_clis(model, expected):
    """The facade scores from the document start: lm-cli score --prompt "<|endoftext|>"."""
    want = expected["score"]
    assert want["prompt_ids"] == [0]
    got = model.score(want["text"])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want["logprobs"], rtol=0, atol=1e-5)


def test_tokenize_and_detokenize(model, expected):
    want = expected["generate"]
    assert model.tokenize(want["prompt"]) == want["prompt_ids"]
    assert model.tokenize(want["prompt"].encode()) == want["prompt_ids"]
    assert model.detokenize(want["ids"]) == want["text"]
    # Special-token text is a control token only when asked.
    assert model.tokenize("<|im_start|>", special=True) == [model.bos_id]
    assert model.bos_id not in model.tokenize("<|im_start|>")
    assert model.detokenize([model.bos_id, 504], special=False) == "The"
    assert model.vocab_size == 49152
    assert model.context_length == 8192
    assert "<|im_start|>" in model.chat_template
    assert model.end_ids == [0, 2, 4]


def test_stop_string_ends_the_text(model):
    got = model.generate("The capital of France is", max_new_tokens=8, temperature=0, stop=["\n"])
    assert got.text == " Paris."
    assert (got.stop_reason, got.stop_string, got.finished) == ("stop_string", "\n", True)


def test_a_seed_repeats_a_sampled_run(model):
    settings = dict(max_new_tokens=12, temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    first = model.generate("Once upon a time", **settings)
    assert model.generate("Once upon a time", **settings).ids == first.ids
    assert len(first.ids) == len(first.logprobs) > 0


def test_structured_output(model):
    chosen = model.chat(
        [{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        choice=["yes", "no"],
        temperature=0,
        max_new_tokens=8,
    )
    assert chosen.text in ("yes", "no")
    assert chosen.stop_reason == "constraint_complete"
    digits = model.generate("The year is", regex="[0-9]{4}", temperature=0, max_new_tokens=8)
    assert len(digits.text) == 4 and digits.text.isdigit()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    person = model.chat(
        [{"role": "user", "content": "Describe a person as JSON."}],
        json_schema=schema,
        temperature=0,
        max_new_tokens=64,
    )
    import json

    value = json.loads(person.text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
