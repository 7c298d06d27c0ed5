"""Bad input raises a named lm.LmError subclass carrying the Rust message; it never crashes."""

import pytest

import lm


def test_a_missing_file(tmp_path):
    path = tmp_path / "nothing.gguf"
    with pytest.raises(lm.ModelFileError, match="not found") as error:
        lm.load(str(path))
    assert str(path) in str(error.value)
    assert isinstance(error.value, lm.LmError)


def test_a_malformed_gguf(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 12)
    with pytest.raises(lm.ModelFileError) as error:
        lm.load(str(truncated))
    assert str(truncated) in str(error.value)
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("just some text, long enough to hold a header and more")
    with pytest.raises(lm.ModelFileError, match="GGUF|magic"):
        lm.load(str(not_gguf))


def test_bad_arguments(model):
    with pytest.raises(lm.InvalidArgument, match="temperature"):
        model.generate("Hi", temperature=-1)
    with pytest.raises(lm.InvalidArgument, match="top_p"):
        model.generate("Hi", top_p=2.0)
    with pytest.raises(lm.InvalidArgument, match="unknown keyword argument tfs_z"):
        model.generate("Hi", tfs_z=1.0)
    with pytest.raises(lm.InvalidArgument, match="max_new_tokens"):
        model.generate("Hi", max_new_tokens="many")
    with pytest.raises(lm.InvalidArgument, match="prompt"):
        model.generate(3.5)
    with pytest.raises(lm.InvalidArgument):
        model.generate([model.vocab_size + 5])
    with pytest.raises(lm.InvalidArgument, match="empty"):
        model.generate([])
    with pytest.raises(lm.InvalidArgument, match="ids"):
        model.logits([])
    with pytest.raises(lm.InvalidArgument):
        model.logits([0, model.vocab_size])
    with pytest.raises(lm.InvalidArgument, match="messages"):
        model.chat("not a list")
    with pytest.raises(lm.InvalidArgument, match="threads"):
        lm.load("whatever.gguf", threads=0)
    with pytest.raises(lm.TokenizerError):
        model.detokenize([model.vocab_size])


def test_a_refused_format(model):
    with pytest.raises(lm.FormatError, match="refused"):
        model.generate("Hi", regex="[0-9")
    with pytest.raises(lm.FormatError, match="root"):
        model.generate("Hi", grammar='answer ::= "yes"')
    with pytest.raises(lm.InvalidArgument, match="at most one"):
        model.generate("Hi", regex="a", choice=["a"])


def test_mmap_of_a_directory(tmp_path):
    with pytest.raises(lm.InvalidArgument, match="mmap=True maps a GGUF file"):
        lm.load(str(tmp_path), mmap=True)
