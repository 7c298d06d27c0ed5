"""Type stubs of the lm module (the native part is lm._lm; see crates/lm-python)."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

Message = Dict[str, Any]
"""A chat message: {"role": "system" | "user" | "assistant" | "tool", "content": str}."""

StopReason = Literal[
    "end_token", "stop_string", "max_new_tokens", "context_length", "cancelled", "constraint_complete"
]

class LmError(Exception):
    """Every error of the lm engine; the message is the Rust error's."""

class ModelFileError(LmError):
    """A path that gives no model: missing, not GGUF, or weights or metadata that build none."""

class InvalidArgument(LmError):
    """A setting, token id, prompt or message that the engine refuses."""

class FormatError(InvalidArgument):
    """A structured-output format (json_schema, regex, grammar, choice) the grammar engine refuses."""

class TokenizerError(LmError):
    """Text or ids that the model's tokenizer cannot convert."""

class TemplateError(LmError):
    """A chat asked of a model without a chat template, or a template that fails to render."""

def load(
    path: Union[str, PathLike[str]], threads: Optional[int] = None, mmap: bool = False
) -> Model:
    """Loads a GGUF file (or a Hugging Face model directory) as a Model.

    threads sizes the worker pool of the model's matrix products (default: all cores); the pool is
    process-wide, so a second load asking for another size raises InvalidArgument. mmap=True maps
    a GGUF file instead of copying it into memory (llama-cpp-python's use_mmap): processes loading
    one file share its pages, but no matrix is packed in panels, so prompts read slower.
    Raises ModelFileError when the path gives no model.
    """

class Completion:
    """A finished generation; str() of it is its text."""

    text: str
    """The generated text (without end tokens, cut before a stop string)."""
    ids: List[int]
    """The generated token ids (an end token that stopped the run is last)."""
    logprobs: List[float]
    """The model's log-probability (natural log) of each generated token, before the sampling policy."""
    prompt_ids: List[int]
    """The prompt's ids as the model read them."""
    stop_reason: StopReason
    """Why the run stopped."""
    stop_string: Optional[str]
    """The stop string that ended the run, if one did."""
    top_logprobs: List[List[Tuple[int, float]]]
    """Per generated token, the logprobs=N most probable tokens under the model and their
    log-probabilities, best first (empty lists when logprobs was not asked)."""
    finished: bool
    """True when the model, a stop string or a constraint ended the run; False when a limit cut it."""

class TextStream(Iterator[str]):
    """The generated text, piece by piece, computed while the GIL is released.

    Breaking out of the loop (or dropping the stream) stops the generation.
    """

    def __iter__(self) -> TextStream: ...
    def __next__(self) -> str:
        """The next piece of text; StopIteration at the end."""
    @property
    def result(self) -> Optional[Completion]:
        """The finished run (ids, logprobs, stop reason) once the loop has ended, else None."""
    def close(self) -> None:
        """Stops the generation after its current step (stop_reason "cancelled")."""

class ChunkStream(Iterator[Dict[str, Any]]):
    """The chunks of a streamed create_completion / create_chat_completion, in llama-cpp-python's shape."""

    def __iter__(self) -> ChunkStream: ...
    def __next__(self) -> Dict[str, Any]:
        """The next chunk dict; StopIteration after the one with a finish_reason."""

Prompt = Union[str, Sequence[int]]

class Tokenizer:
    """A model's tokenizer (model.tokenizer), with HF's and llama-cpp-python's names."""

    def __call__(self) -> Tokenizer:
        """Itself, so llama-cpp-python's llm.tokenizer() works."""
    def encode(self, text: Union[str, bytes], add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of text. add_bos: prepend BOS when the vocabulary asks for it. special: read
        special-token text such as <|im_start|> as the control token."""
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ids; skip_special_tokens leaves special tokens out."""
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> List[str]:
        """The vocabulary's text of each id (byte-level form, e.g. "\u0120the"); InvalidArgument for an
        id outside the vocabulary."""
    def token_to_id(self, token: str) -> Optional[int]:
        """The id whose vocabulary text is exactly token, else None."""
    def is_special(self, id: int) -> bool:
        """Whether id is a special (control) token."""
    @property
    def vocab_size(self) -> int:
        """The number of token ids; len(tokenizer) too."""
    @property
    def bos_token_id(self) -> Optional[int]:
        """The beginning-of-sequence id, if the vocabulary names one."""
    @property
    def eos_token_id(self) -> Optional[int]:
        """The end-of-sequence id, if the vocabulary names one."""
    @property
    def end_ids(self) -> List[int]:
        """The ids that end a generation (EOS and the end-of-turn tokens)."""
    def __len__(self) -> int: ...

class Model:
    """A loaded model: weights, tokenizer, chat template and end tokens. Thread-safe and immutable.

    Generation keywords (generate, chat, create_completion, create_chat_completion):
      max_new_tokens (alias max_tokens): int or None (until an end token or the context is full)
      temperature: 0 is greedy; top_k, top_p, min_p, typical_p: the filters
      seed: int (default: a fresh one per call)
      stop: str or list of str
      repeat_penalty (alias repetition_penalty), presence_penalty, frequency_penalty
      mirostat_mode (1 or 2), mirostat_tau, mirostat_eta
      logit_bias: {token id: bias}
      one of json_schema (dict or JSON str), regex, grammar (GBNF, llama.cpp's format, or Lark), choice (list of str),
      response_format ({"type": "json_object"[, "schema": ...]} or OpenAI's json_schema shape)
      logprobs: an int N (generate, create_completion: N top alternatives per token, at most 20), or
        True with top_logprobs=N (create_chat_completion); Completion.top_logprobs, or the dicts'
        "logprobs" in llama-cpp-python's / OpenAI's shapes (not with stream=True)
      draft: "prompt-lookup", a draft model's path or an lm.Model with the same vocabulary:
        speculative decoding (greedy: the same ids as without it)
      num_beams (generate, chat): beam search, the best hypothesis; length_penalty (default 1.0)
      echo (create_completion): the prompt's text leads the completion's (not with logprobs or stream)
      suffix and tools (tool_choice, functions, function_call) raise InvalidArgument.
    An unknown keyword raises InvalidArgument; None means "not given".
    generate and chat default to temperature 1 and 20 new tokens; the create_* methods to
    llama-cpp-python's (temperature 0.8 / 0.2, top_k 40, top_p 0.95, min_p 0.05, 16 / unbounded tokens).
    """

    @property
    def context_length(self) -> Optional[int]:
        """The most positions (prompt plus generated tokens) the model reads."""
    @property
    def vocab_size(self) -> int:
        """The number of token ids (the width of a logits row)."""
    @property
    def chat_template(self) -> Optional[str]:
        """The Jinja chat template stored with the model, if any."""
    @property
    def bos_id(self) -> Optional[int]:
        """The beginning-of-sequence token id, if the vocabulary names one."""
    @property
    def eos_id(self) -> Optional[int]:
        """The end-of-sequence token id, if the vocabulary names one."""
    @property
    def end_ids(self) -> List[int]:
        """The ids that end a generation (EOS and the end-of-turn tokens)."""
    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer as an object (encode, decode, vocab_size, bos_token_id, ...)."""
    @property
    def path(self) -> str:
        """The path the model was loaded from."""
    def tokenize(self, text: Union[str, bytes], add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of text. add_bos: prepend BOS when the vocabulary asks for it. special: read
        special-token text such as <|im_start|> as the control token."""
    def detokenize(self, ids: Sequence[int], special: bool = True) -> str:
        """The text of ids; special: write special tokens out (else they are left out)."""
    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """The logits after each of ids, read from a fresh sequence: shape (len(ids), vocab_size)."""
    def score(self, text: str) -> npt.NDArray[np.float64]:
        """The log-probability of each token of text read from the start of a document (after SmolLM2's
        <|endoftext|>, Gemma's BOS; else after the first token, not scored); .sum() is the text's
        log-probability."""
    @overload
    def generate(self, prompt: Prompt, stream: Literal[False] = False, **kwargs: Any) -> Completion: ...
    @overload
    def generate(self, prompt: Prompt, stream: Literal[True], **kwargs: Any) -> TextStream: ...
    @overload
    def generate(self, prompt: List[Prompt], stream: Literal[False] = False, **kwargs: Any) -> List[Completion]: ...
    def generate(
        self, prompt: Union[Prompt, List[Prompt]], stream: bool = False, **kwargs: Any
    ) -> Union[Completion, TextStream, List[Completion]]:
        """Generates a continuation of prompt (text, encoded as lm-cli does, or token ids); a list of
        prompts (strings or id lists) runs as one batch through the multi-sequence forward and gives
        one Completion per prompt (greedy: the ids each gives alone)."""
    @overload
    def chat(self, messages: List[Message], stream: Literal[False] = False, **kwargs: Any) -> Completion: ...
    @overload
    def chat(self, messages: List[Message], stream: Literal[True], **kwargs: Any) -> TextStream: ...
    def chat(self, messages: List[Message], stream: bool = False, **kwargs: Any) -> Union[Completion, TextStream]:
        """The assistant's reply to messages, in the model's chat template."""
    @overload
    def create_completion(self, prompt: Prompt, stream: Literal[False] = False, **kwargs: Any) -> Dict[str, Any]: ...
    @overload
    def create_completion(self, prompt: Prompt, stream: Literal[True], **kwargs: Any) -> ChunkStream: ...
    def create_completion(
        self, prompt: Prompt, stream: bool = False, **kwargs: Any
    ) -> Union[Dict[str, Any], ChunkStream]:
        """llama-cpp-python's Llama.create_completion: a "text_completion" dict, or its chunks."""
    @overload
    def create_chat_completion(
        self, messages: List[Message], stream: Literal[False] = False, **kwargs: Any
    ) -> Dict[str, Any]: ...
    @overload
    def create_chat_completion(self, messages: List[Message], stream: Literal[True], **kwargs: Any) -> ChunkStream: ...
    def create_chat_completion(
        self, messages: List[Message], stream: bool = False, **kwargs: Any
    ) -> Union[Dict[str, Any], ChunkStream]:
        """llama-cpp-python's Llama.create_chat_completion: a "chat.completion" dict, or its
        "chat.completion.chunk" dicts."""
