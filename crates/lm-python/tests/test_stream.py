"""Streaming: the pieces make the whole text, and leaving the loop stops the generation."""

import os

import lm


def os_threads():
    """The process's OS threads (the generation runs on a thread of its own)."""
    return len(os.listdir("/proc/self/task"))


def test_pieces_join_to_the_whole_text(model):
    # The stop string holds back the pieces that could start it; they come out at the end.
    settings = dict(max_new_tokens=24, temperature=0, stop=["States"])
    whole = model.generate("The capital of France is", **settings)
    assert whole.text == " Paris.\n\nThe United "
    stream = model.generate("The capital of France is", stream=True, **settings)
    assert isinstance(stream, lm.TextStream)
    assert stream.result is None
    pieces = list(stream)
    assert len(pieces) > 1
    assert "".join(pieces) == whole.text
    assert stream.result.ids == whole.ids
    assert stream.result.stop_reason == whole.stop_reason


def test_breaking_out_of_the_loop_stops_the_generation(model, no_end):
    model.generate("Warm up", max_new_tokens=2, temperature=0)  # the model's worker pool starts once
    before = os_threads()
    stream = model.generate("Once upon a time", max_new_tokens=4000, logit_bias=no_end, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert os_threads() == before + 1  # the generation's thread is still there ...
    del stream
    assert os_threads() == before  # ... and gone (joined) once the stream is


def test_close_cancels_the_run(model, no_end):
    stream = model.generate("Once upon a time", max_new_tokens=4000, logit_bias=no_end, stream=True)
    next(stream)
    stream.close()
    rest = list(stream)
    assert stream.result.stop_reason == "cancelled"
    assert len(stream.result.ids) < 100, len(rest)


def test_chat_streams_the_reply(model):
    messages = [{"role": "user", "content": "What is 2 plus 2?"}]
    whole = model.chat(messages, max_new_tokens=32, temperature=0)
    assert "4" in whole.text
    assert whole.stop_reason == "end_token"
    assert "".join(model.chat(messages, max_new_tokens=32, temperature=0, stream=True)) == whole.text
