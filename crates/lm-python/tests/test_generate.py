"""generate, tokenize, logits and score against lm-cli's results and against numpy."""

import re

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
    # GBNF, llama.cpp's grammar format (what llama-cpp-python's LlamaGrammar
    # reads), and the same language in Lark: both give the same greedy answer.
    gbnf = 'root ::= answer " " [0-9]\nanswer ::= "yes" | "no"'
    by_gbnf = model.generate("Answer:", grammar=gbnf, temperature=0, max_new_tokens=8)
    assert re.fullmatch("(yes|no) [0-9]", by_gbnf.text)
    lark = 'start: answer " " /[0-9]/\nanswer: "yes" | "no"'
    assert model.generate("Answer:", grammar=lark, temperature=0, max_new_tokens=8).ids == by_gbnf.ids
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


def test_the_tokenizer_object(model, expected):
    """model.tokenizer: HF's and llama-cpp-python's names over the same tokenizer as tokenize()."""
    want = expected["generate"]
    tokenizer = model.tokenizer
    assert tokenizer() is not None  # llama-cpp-python calls llm.tokenizer()
    assert tokenizer.encode(want["prompt"]) == model.tokenize(want["prompt"]) == want["prompt_ids"]
    assert tokenizer.decode(want["ids"]) == want["text"]
    assert tokenizer.decode([model.bos_id, 504], skip_special_tokens=True) == "The"
    assert tokenizer.decode([model.bos_id, 504]) == "<|im_start|>The"
    assert tokenizer.vocab_size == len(tokenizer) == model.vocab_size
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (model.bos_id, model.eos_id) == (1, 2)
    assert tokenizer.end_ids == model.end_ids
    assert tokenizer.convert_ids_to_tokens([504, 7042]) == ["The", "\u0120Paris"]
    assert tokenizer.token_to_id("\u0120Paris") == 7042 and tokenizer.token_to_id("no such token") is None
    assert tokenizer.is_special(model.bos_id) and not tokenizer.is_special(504)
    with pytest.raises(lm.InvalidArgument):
        tokenizer.convert_ids_to_tokens([model.vocab_size])


def test_top_logprobs_are_the_logits_best(model, expected):
    """generate(logprobs=N): each step's N best tokens and log-probabilities, from numpy's log-softmax."""
    want = expected["generate"]
    got = model.generate(want["prompt"], max_new_tokens=8, temperature=0, logprobs=3)
    np.testing.assert_allclose(got.logprobs, want["logprobs"], rtol=0, atol=1e-5)
    rows = model.logits(want["prompt_ids"] + want["ids"])[len(want["prompt_ids"]) - 1 : -1].astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    for row, top, token, logprob in zip(rows, got.top_logprobs, got.ids, got.logprobs):
        best = np.argsort(-row)[:3]
        assert [id for id, _ in top] == list(best)
        np.testing.assert_allclose([value for _, value in top], row[best], rtol=0, atol=1e-4)
        assert top[0] == (token, logprob)  # greedy: the chosen token is the best, the same value
    assert model.generate("Hi", max_new_tokens=2).top_logprobs == [[], []]


def test_a_mapped_file_generates_the_copied_one_s_text(smollm2_path, monkeypatch):
    """The same kernels give the same text from the file's pages as from a copy. A copy packs SmolLM2's
    Q4_1 matrices in panels (sums in another order) and a map cannot, so this copy stays row-major
    (LM_PACK=0, read at load), as lm-cli's mmap test does."""
    monkeypatch.setenv("LM_PACK", "0")
    copied = lm.load(str(smollm2_path))
    mapped = lm.load(str(smollm2_path), mmap=True)
    prompt = "The capital of France is"
    want = copied.generate(prompt, max_new_tokens=12, temperature=0)
    assert mapped.generate(prompt, max_new_tokens=12, temperature=0).text == want.text
