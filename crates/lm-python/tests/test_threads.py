"""The GIL is released while the model computes, Ctrl-C stops a generation, and 1,000 calls leak nothing."""

import _thread
import gc
import sys
import threading
import time

import pytest

import lm


def test_another_thread_runs_while_one_generates(model, no_end):
    """A heartbeat thread beats every millisecond; under a held GIL it could not beat at all during
    the call (it would wait for the whole generation), so beats inside the call prove the release."""
    beats = []
    stop = threading.Event()

    def heartbeat():
        while not stop.is_set():
            beats.append(time.monotonic())
            time.sleep(0.001)

    beater = threading.Thread(target=heartbeat)
    beater.start()
    try:
        start = time.monotonic()
        run = model.generate("Once upon a time", max_new_tokens=64, logit_bias=no_end, temperature=0)
        end = time.monotonic()
    finally:
        stop.set()
        beater.join()
    assert len(run.ids) == 64
    inside = [beat for beat in beats if start < beat < end]
    assert len(inside) >= 10, f"{len(inside)} beats during a {end - start:.2f} s generation"


def test_ctrl_c_stops_a_generation(model, no_end):
    """KeyboardInterrupt (here simulated) arrives between two steps, not after the whole run
    (8,000 tokens: minutes on two cores). The bound is far from either, so it is no speed test."""
    for mode in [{"temperature": 0}, {"num_beams": 2}]:
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            model.generate("Once upon a time", max_new_tokens=8000, logit_bias=no_end, **mode)
        assert time.monotonic() - start < 20, mode
        timer.join()


def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_a_thousand_calls_leak_nothing(model):
    """Bounds: a leaked Python object per call (a Completion, a dict, a list) would add >= 1,000
    blocks to Python's allocator (sys.getallocatedblocks counts every live object); a leaked Rust buffer per call (a logits row is 49,152 x 4 = 192 KiB, a
    decoder state more) would add >= 190 MB of RSS; 16 MB leaves room for the allocator's slack."""

    def calls(n):
        for i in range(n):
            model.generate([504 + i % 7], max_new_tokens=1, temperature=0)
            model.detokenize(model.tokenize("The capital of France is"))
            try:
                model.generate("Hi", temperature=-1)
            except lm.InvalidArgument:
                pass
            if i % 10 == 0:
                model.logits([504, 3575])
                list(model.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=1, stream=True))
                list(model.generate("Hi", max_new_tokens=3, stream=True))
                model.create_completion("Hi", max_tokens=1, logprobs=2)
                model.generate(["Hi", [504]], max_new_tokens=1, temperature=0, num_beams=None)
                model.tokenizer.decode([504])

    calls(100)
    gc.collect()
    blocks, rss = sys.getallocatedblocks(), rss_bytes()
    calls(1000)
    gc.collect()
    assert sys.getallocatedblocks() - blocks < 200
    assert rss_bytes() - rss < 16 * 2**20, f"RSS grew by {(rss_bytes() - rss) / 2**20:.1f} MiB"
