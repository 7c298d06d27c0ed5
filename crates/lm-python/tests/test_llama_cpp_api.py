"""llama-cpp-python's create_chat_completion / create_completion, called as a script written for it."""

import numpy as np
import pytest

import lm

# A script written for llama-cpp-python; only the import and the constructor differ:
#     from llama_cpp import Llama
#     llm = Llama(model_path=PATH)
SCRIPT = '''
messages = [{"role": "user", "content": "What is 2 plus 2?"}]
out = llm.create_chat_completion(messages=messages, max_tokens=48, temperature=0)
answer = out["choices"][0]["message"]["content"]
finish_reason = out["choices"][0]["finish_reason"]
usage = out["usage"]

streamed = ""
roles = []
finish_reasons = []
for chunk in llm.create_chat_completion(messages=messages, max_tokens=48, temperature=0, stream=True):
    delta = chunk["choices"][0]["delta"]
    if "role" in delta:
        roles.append(delta["role"])
    if "content" in delta:
        streamed += delta["content"]
    finish_reasons.append(chunk["choices"][0]["finish_reason"])

completion = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)
completion_text = completion["choices"][0]["text"]
completion_streamed = "".join(
    chunk["choices"][0]["text"]
    for chunk in llm.create_completion("The capital of France is", max_tokens=8, temperature=0, stream=True)
)
'''


def test_a_llama_cpp_python_script_runs(smollm2_path, expected):
    scope = {"llm": lm.load(str(smollm2_path))}
    exec(SCRIPT, scope)
    assert "4" in scope["answer"]
    assert scope["finish_reason"] == "stop"
    assert scope["streamed"] == scope["answer"]
    assert scope["roles"] == ["assistant"]
    assert scope["finish_reasons"][-1] == "stop" and set(scope["finish_reasons"][:-1]) == {None}
    usage = scope["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert scope["completion_text"] == scope["completion_streamed"] == expected["generate"]["text"]


def test_the_dicts_have_openais_shape(model, expected):
    out = model.create_completion("The capital of France is", max_tokens=8, temperature=0)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert out["model"].endswith(".gguf") and isinstance(out["created"], int)
    assert out["choices"] == [
        {"text": expected["generate"]["text"], "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    chat = model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    assert chat["choices"][0]["message"]["role"] == "assistant"
    chunks = list(model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, stream=True))
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1


def test_response_format_constrains_the_reply(model):
    import json

    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    out = model.create_chat_completion(
        [{"role": "user", "content": "What is 2 plus 2? Answer in JSON."}],
        response_format={"type": "json_object", "schema": schema},
        temperature=0,
        max_tokens=32,
    )
    assert set(json.loads(out["choices"][0]["message"]["content"])) == {"answer"}


def test_logprobs_in_llama_cpp_pythons_shapes(model, expected):
    """create_completion(logprobs=N) and create_chat_completion(logprobs=True, top_logprobs=N) carry
    the values generate() gives (to 1e-6), in llama-cpp-python's / OpenAI's shapes."""
    want = expected["generate"]
    run = model.generate(want["prompt"], max_new_tokens=8, temperature=0, logprobs=2)
    out = model.create_completion(want["prompt"], max_tokens=8, temperature=0, logprobs=2)
    logprobs = out["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert "".join(logprobs["tokens"]) == want["text"]
    np.testing.assert_allclose(logprobs["token_logprobs"], run.logprobs, rtol=0, atol=1e-6)
    # Offsets count from the prompt's start, as llama-cpp-python's.
    lengths = [len(token) for token in logprobs["tokens"]]
    assert logprobs["text_offset"] == [len(want["prompt"]) + sum(lengths[:i]) for i in range(8)]
    for alternatives, top, token in zip(logprobs["top_logprobs"], run.top_logprobs, logprobs["tokens"]):
        assert len(alternatives) == 2 and token in alternatives
        np.testing.assert_allclose(sorted(alternatives.values()), sorted(v for _, v in top), rtol=0, atol=1e-6)

    messages = [{"role": "user", "content": "What is 2 plus 2?"}]
    chat_run = model.chat(messages, max_new_tokens=6, temperature=0, logprobs=3)
    chat = model.create_chat_completion(messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = chat["choices"][0]["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == chat["choices"][0]["message"]["content"]
    np.testing.assert_allclose([entry["logprob"] for entry in content], chat_run.logprobs, rtol=0, atol=1e-6)
    for entry, top in zip(content, chat_run.top_logprobs):
        assert bytes(entry["bytes"]) == entry["token"].encode()
        assert [alt["token"] for alt in entry["top_logprobs"]] == [model.detokenize([id]) for id, _ in top]
        np.testing.assert_allclose([alt["logprob"] for alt in entry["top_logprobs"]], [v for _, v in top], atol=1e-6)
    # A run that ends on <|im_end|>: the end token has no entry (its text is not in the content).
    ended = model.create_chat_completion(messages, max_tokens=48, temperature=0, logprobs=True)
    assert ended["choices"][0]["finish_reason"] == "stop"
    content = ended["choices"][0]["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == ended["choices"][0]["message"]["content"]
    assert len(content) == ended["usage"]["completion_tokens"] - 1
    plain = model.create_chat_completion(messages, max_tokens=2, logprobs=False)
    assert plain["choices"][0]["logprobs"] is None


def test_echo_and_the_unsupported_keywords(model, expected):
    want = expected["generate"]
    out = model.create_completion(want["prompt"], max_tokens=8, temperature=0, echo=True)
    assert out["choices"][0]["text"] == want["prompt"] + want["text"]
    for keywords, message in [
        (dict(suffix="!"), "suffix: fill-in-the-middle is not supported"),
        (dict(echo=True, logprobs=1), "echo=True with logprobs"),
        (dict(echo=True, stream=True), "not supported with stream=True"),
        (dict(logprobs=1, stream=True), "not supported with stream=True"),
        (dict(logprobs=21), "at most 20"),
        (dict(num_beams=2), "num_beams"),
    ]:
        with pytest.raises(lm.InvalidArgument, match=message):
            model.create_completion(want["prompt"], max_tokens=2, **keywords)
    messages = [{"role": "user", "content": "Hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(lm.InvalidArgument, match="tools: tool calling"):
        model.create_chat_completion(messages, tools=tools)
    with pytest.raises(lm.InvalidArgument, match="top_logprobs needs logprobs=True"):
        model.create_chat_completion(messages, top_logprobs=2)
    assert model.create_chat_completion(messages, max_tokens=1, tools=None)["object"] == "chat.completion"
