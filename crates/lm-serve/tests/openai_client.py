"""Drives a running lm-serve with the official `openai` Python client.

Usage: python openai_client.py BASE_URL
Checks completions, chat, streaming, logprobs, n, stop, seeded
reproducibility, llama-server's sampler fields (extra_body) and response_format; prints one line per check and exits 1 at the first failure.
"""

import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
MODEL = "smollm2"


def check(name, condition, detail=""):
    print(("ok   " if condition else "FAIL ") + name + (f": {detail}" if detail and not condition else ""))
    if not condition:
        sys.exit(1)


models = client.models.list()
check("models lists one model", len(models.data) == 1 and models.data[0].object == "model")

greedy = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
check("completion text", greedy.choices[0].text.startswith(" Paris"), repr(greedy.choices[0].text))
check("completion usage", greedy.usage.prompt_tokens == 5 and greedy.usage.completion_tokens == 8, greedy.usage)
check("finish_reason length", greedy.choices[0].finish_reason == "length")

chat = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24, temperature=0
)
check("chat answers as the assistant", chat.choices[0].message.role == "assistant")
# SmolLM2 Q4_1 greedy: what `echo ... | lm-cli chat --model smollm2 -t 0 -n 24` prints.
check(
    "chat text",
    chat.choices[0].message.content.startswith("L'\u00c9toile, la Marseillaise"),
    repr(chat.choices[0].message.content),
)

pieces = []
finish = None
for chunk in client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24,
    temperature=0,
    stream=True,
):
    if chunk.choices:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
check("streamed chat equals the whole answer", "".join(pieces) == chat.choices[0].message.content, pieces)
check("streamed finish_reason", finish == chat.choices[0].finish_reason, finish)

stream = client.completions.create(
    model=MODEL, prompt="Once upon a time", max_tokens=10, seed=7, stream=True, stream_options={"include_usage": True}
)
chunks = list(stream)
check("stream usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10, chunks[-1])

logprobs = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Say hi"}],
    max_tokens=4,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
)
content = logprobs.choices[0].logprobs.content
check("chat logprobs per token", len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content))
check(
    "greedy picks the most probable token",
    all(abs(c.logprob - max(t.logprob for t in c.top_logprobs)) < 1e-4 for c in content),
)
legacy = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=3, temperature=0, logprobs=2)
check("completion logprobs", len(legacy.choices[0].logprobs.tokens) == 3 and len(legacy.choices[0].logprobs.top_logprobs[0]) == 2)

many = client.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=8, n=3, seed=11, temperature=1.0)
check("n choices", [c.index for c in many.choices] == [0, 1, 2])
again = client.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=8, n=3, seed=11, temperature=1.0)
check("seeded reproducibility", [c.text for c in many.choices] == [c.text for c in again.choices])

# llama-server's sampler fields go through `extra_body`.
dry = dict(model=MODEL, prompt="My favourite colour is", max_tokens=8, seed=1, extra_body={"dry_multiplier": 0.8, "mirostat": 2})
first, second = client.completions.create(**dry), client.completions.create(**dry)
check("extra_body samplers, seeded", first.choices[0].text != "" and first.choices[0].text == second.choices[0].text, first)
try:
    client.completions.create(model=MODEL, prompt="x", extra_body={"mirostat": 3})
    check("mirostat 3 is refused", False)
except Exception as error:  # openai.BadRequestError
    check("mirostat 3 is a 400 naming the field", getattr(error, "status_code", None) == 400 and "mirostat" in str(error), error)

stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
check("stop string", stopped.choices[0].finish_reason == "stop" and " 7" not in stopped.choices[0].text, stopped.choices[0])

try:
    client.completions.create(model=MODEL, prompt="x", temperature=5)
    check("bad temperature is refused", False)
except Exception as error:  # openai.BadRequestError
    check("bad temperature is a 400 naming the field", getattr(error, "status_code", None) == 400 and "temperature" in str(error), error)

person = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
structured = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Describe a person as JSON."}],
    max_tokens=60,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}},
)
content = structured.choices[0].message.content
try:
    answer = json.loads(content)
except ValueError:
    answer = None
check(
    "response_format json_schema",
    isinstance(answer, dict)
    and set(answer) == {"name", "age"}
    and isinstance(answer["name"], str)
    and len(answer["name"]) <= 20
    and isinstance(answer["age"], int)
    and answer["age"] >= 0
    and structured.choices[0].finish_reason == "stop",
    repr(content),
)

try:
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}},
    )
    check("a refused schema is refused", False)
except Exception as error:  # openai.BadRequestError
    check(
        "a refused schema is a 400 naming response_format",
        getattr(error, "status_code", None) == 400 and "response_format" in str(error),
        error,
    )

print("all checks passed")
