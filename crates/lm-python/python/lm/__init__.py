"""Python bindings of the lm text-generation engine (the Rust crates lm and lm-decode).

    import lm
    model = lm.load("SmolLM2-135M-Instruct-Q8_0.gguf")
    print(model.generate("The capital of France is", max_new_tokens=8, temperature=0))

Everything is implemented in the native module ``lm._lm``; this package re-exports it.
"""

from ._lm import (
    ChunkStream,
    Completion,
    FormatError,
    InvalidArgument,
    LmError,
    Model,
    ModelFileError,
    TemplateError,
    TextStream,
    Tokenizer,
    TokenizerError,
    load,
)

__all__ = [
    "ChunkStream",
    "Completion",
    "FormatError",
    "InvalidArgument",
    "LmError",
    "Model",
    "ModelFileError",
    "TemplateError",
    "TextStream",
    "Tokenizer",
    "TokenizerError",
    "load",
]
