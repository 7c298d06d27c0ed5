"""llama-cpp-python's create_chat_completion / create_completion, called as a script written for it."""

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
