"""Drives a running lm-serve's tool calls and guided decoding with the
official `openai` Python client, validating with `jsonschema`.

Usage: python tool_calls.py BASE_URL MODEL [--guided] [--marker TEXT]
Checks: tool_choice "required" gives a call whose arguments validate in 20 of
20 seeded requests; a named tool_choice calls that function; streamed
tool-call deltas assemble to the call the whole answer gives for the same
seed, the arguments in more than one piece; a two-turn loop (call, tool
result, answer) completes; with --marker (the text the template's calls open
with), under tool_choice "auto" a reply pushed into the marker by logit_bias
makes a valid call in 10 of 10 seeded runs, and one kept from it is text; with --guided,
regex, choice, Lark and json_schema requests conform in 10 of 10 seeded runs,
and bad fields are 400s. Prints one line per check; exits 1 at the first
failure.
"""

import json
import re
import sys

import jsonschema
import openai
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=300)
MODEL = sys.argv[2]
GUIDED = "--guided" in sys.argv
MARKER = sys.argv[sys.argv.index("--marker") + 1] if "--marker" in sys.argv else None

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 40}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def check(name, condition, detail=""):
    print(("ok   " if condition else "FAIL ") + name + (f": {detail}" if detail and not condition else ""))
    if not condition:
        sys.exit(1)


def valid_call(call):
    """The call's arguments parse and validate against its tool's schema."""
    if call.type != "function" or call.function.name not in SCHEMAS or not call.id.startswith("call_"):
        return False
    try:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def required(seed, parallel_tool_calls=False, **extra):
    return client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
        max_tokens=200, temperature=0.8, seed=seed, parallel_tool_calls=parallel_tool_calls, **extra,
    )


good = 0
ids = set()
for seed in range(20):
    answer = required(seed)
    choice = answer.choices[0]
    calls = choice.message.tool_calls or []
    ok = choice.finish_reason == "tool_calls" and len(calls) >= 1 and all(valid_call(c) for c in calls)
    ids.update(c.id for c in calls)
    good += ok
    if not ok:
        print("     seed", seed, choice.finish_reason, choice.message)
check("tool_choice required: valid calls in 20 of 20 seeded requests", good == 20, f"{good} of 20")
check("tool call ids are unique", len(ids) >= 20, len(ids))

# parallel_tool_calls (OpenAI's default): one or more calls, each valid; a
# small model may repeat calls until max_tokens, and then the complete ones
# are returned with finish_reason "length".
for seed in range(5):
    choice = required(seed, parallel_tool_calls=True).choices[0]
    calls = choice.message.tool_calls or []
    check(
        f"parallel_tool_calls: complete calls, each valid (seed {seed})",
        choice.finish_reason in ("tool_calls", "length") and len(calls) >= 1 and all(valid_call(c) for c in calls),
        choice,
    )

named = client.chat.completions.create(
    model=MODEL, messages=QUESTION, tools=TOOLS, max_tokens=200, temperature=0.8, seed=3,
    tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False,
)
calls = named.choices[0].message.tool_calls or []
check("a named tool_choice calls that function, once", len(calls) == 1 and calls[0].function.name == "get_time" and valid_call(calls[0]), named.choices[0].message)

# Streaming: the deltas assemble to the whole answer's calls (same seed).
for seed in (0, 7):
    whole = required(seed).choices[0].message.tool_calls
    assembled = {}
    finish = None
    for chunk in required(seed, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = assembled.setdefault(delta.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
                if delta.id:
                    entry["id"] = delta.id
                if delta.function and delta.function.name:
                    entry["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    entry["arguments"] += delta.function.arguments
                    entry["pieces"] += 1
            finish = choice.finish_reason or finish
    streamed = [(e["name"], e["arguments"]) for _, e in sorted(assembled.items())]
    check(
        f"streamed tool-call deltas assemble to the whole answer's calls (seed {seed})",
        finish == "tool_calls" and streamed == [(c.function.name, c.function.arguments) for c in whole]
        and all(e["id"] and e["id"].startswith("call_") for e in assembled.values()),
        f"{streamed} vs {whole}, finish {finish}",
    )
    # The arguments come as the model writes them, not in one piece.
    check(
        f"streamed arguments arrive in more than one piece (seed {seed})",
        all(e["pieces"] > 1 for e in assembled.values() if len(e["arguments"]) > 16),
        assembled,
    )

if MARKER:
    # Under "auto" the model may answer in text, but a call it starts is
    # enforced. logit_bias pushes the reply into the marker's tokens; from
    # there the grammar holds it to a call of a listed tool.
    base = sys.argv[1].removesuffix("/v1")
    import urllib.request

    request = urllib.request.Request(
        base + "/tokenize", data=json.dumps({"content": MARKER}).encode(),
        headers={"Content-Type": "application/json"},
    )
    marker_tokens = json.load(urllib.request.urlopen(request))["tokens"]
    good = 0
    for seed in range(10):
        choice = client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="auto", max_tokens=120,
            temperature=0.8, seed=seed, logit_bias={str(t): 100 for t in marker_tokens},
            parallel_tool_calls=False,
        ).choices[0]
        calls = choice.message.tool_calls or []
        ok = choice.finish_reason == "tool_calls" and len(calls) >= 1 and all(valid_call(c) for c in calls)
        good += ok
        if not ok:
            print("     seed", seed, choice.finish_reason, choice.message)
    check("tool_choice auto: a reply pushed into a call makes a valid call in 10 of 10 seeded runs", good == 10, f"{good} of 10")
    # Kept from the marker's first token, the reply is text.
    text = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="auto", max_tokens=24,
        temperature=0.8, seed=1, logit_bias={str(marker_tokens[0]): -100},
    ).choices[0]
    check("tool_choice auto: a plain-text answer", text.message.tool_calls is None and text.message.content and text.finish_reason in ("stop", "length"), text)

# A two-turn loop: the call, its result, and the next answer.
first = required(11)
call = first.choices[0].message.tool_calls[0]
history = QUESTION + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}
    ]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
]
second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=48, temperature=0, seed=1)
choice = second.choices[0]
check(
    "two-turn tool loop: the answer after the tool result",
    second.usage.prompt_tokens > first.usage.prompt_tokens
    and choice.finish_reason in ("stop", "length", "tool_calls")
    and (choice.message.content or choice.message.tool_calls),
    choice,
)
check(
    "two-turn tool loop: a call in the second answer is valid too",
    all(valid_call(c) for c in choice.message.tool_calls or []),
    choice.message,
)
none = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0)
check("tool_choice none answers in text", none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length"), none.choices[0])


def bad_request(name, param, **fields):
    try:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **fields)
    except openai.BadRequestError as error:
        got = (error.body or {}).get("param")
        check(f"400 naming '{param}': {name}", got == param, f"param {got!r}: {error}")
        return
    check(f"400 naming '{param}': {name}", False, "no error")


bad_request("tool_choice required without tools", "tool_choice", tool_choice="required")
bad_request("a named function not in tools", "tool_choice", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
bad_request("a tool of another type", "tools[0]", tools=[{"type": "retrieval"}])

if GUIDED:
    def guided(seed, temperature=1.0, **extra):
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Give me a code."}],
            max_tokens=128, temperature=temperature, seed=seed, extra_body=extra,
        )
        return answer.choices[0].message.content, answer.choices[0].finish_reason

    pattern = r"[A-Z]{2}-[0-9]{3}"
    runs = [guided(s, guided_regex=pattern) for s in range(10)]
    check("guided_regex: 10 of 10 match", all(re.fullmatch(pattern, t) and f == "stop" for t, f in runs), runs)
    runs = [guided(s, regex=r"(yes|no), [a-z]{1,8}") for s in range(10)]
    check("regex (llama-server's name): 10 of 10 match", all(re.fullmatch(r"(yes|no), [a-z]{1,8}", t) for t, _ in runs), runs)
    options = ["red", "green", "blue"]
    runs = [guided(s, guided_choice=options) for s in range(10)]
    check("guided_choice: 10 of 10 are a choice", all(t in options and f == "stop" for t, f in runs), runs)
    lark = 'start: greeting " " NAME "!"\ngreeting: "hello" | "goodbye"\nNAME: /[a-z]{1,10}/'
    runs = [guided(s, guided_grammar=lark) for s in range(10)]
    check("guided_grammar (Lark): 10 of 10 conform", all(re.fullmatch(r"(hello|goodbye) [a-z]{1,10}!", t) for t, _ in runs), runs)
    runs = [guided(s, grammar=lark) for s in range(10)]
    check("grammar (Lark): 10 of 10 conform", all(re.fullmatch(r"(hello|goodbye) [a-z]{1,10}!", t) for t, _ in runs), runs)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": False}
    # JSON allows any whitespace between tokens, which sampling at 1.0 can
    # run on with until max_tokens; 0.7 keeps these ten seeds short.
    runs = [guided(s, temperature=0.7, json_schema=schema) for s in range(10)]

    def validates(text):
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    check("json_schema (llama-server's field): 10 of 10 validate", all(validates(t) for t, _ in runs), runs)

    bad_request("a bad regular expression", "guided_regex", extra_body=dict(guided_regex="[0-9"))
    bad_request("a bad Lark grammar", "guided_grammar", extra_body=dict(guided_grammar="start: ("))
    bad_request("a GBNF grammar that does not parse", "grammar", extra_body=dict(grammar='root ::= "a'))
    bad_request("two constraints at once", "guided_choice", extra_body=dict(regex="a", guided_choice=["a"]))
    bad_request("a constraint and response_format", "json_schema", extra_body=dict(json_schema={"type": "object"}, response_format={"type": "json_object"}))
    bad_request("guided_choice not a list of strings", "guided_choice", extra_body=dict(guided_choice="red"))

print("all checks passed")
