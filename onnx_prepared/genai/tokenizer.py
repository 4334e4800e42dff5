"""Tokenizer and TokenizerStream over ``tokenizer.json``, through Hugging Face's ``tokenizers`` library.

``tokenizers`` is the optional ``genai`` extra; without it, creating a Tokenizer raises a
MissingDependencyError that says what to install.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from onnx_prepared.errors import MissingDependencyError, ModelLoadError

TOKENIZER_FILE = "tokenizer.json"


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise MissingDependencyError("text generation needs the 'tokenizers' library: "
                                     "pip install 'onnx-prepared[genai]'") from None
    return tokenizers


class Tokenizer:
    """``og.Tokenizer(model)``: text <-> token ids with the folder's ``tokenizer.json``.

    >>> tok = Tokenizer(model)
    >>> ids = tok.encode("Hello")          # np.ndarray of int32
    >>> tok.decode(ids)
    """

    def __init__(self, model: Any):
        folder = model if isinstance(model, (str, os.PathLike)) else model.folder
        path = os.path.join(os.fspath(folder), TOKENIZER_FILE)
        lib = _tokenizers()
        if not os.path.exists(path):
            raise ModelLoadError(f"{folder} has no {TOKENIZER_FILE} (the model's tokenizer, in Hugging Face "
                                 "tokenizers' format)")
        try:
            self._tok = lib.Tokenizer.from_file(path)
        except Exception as e:  # the library raises its own exception type
            raise ModelLoadError(f"{path}: not a valid tokenizer ({e})") from None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

    def decode(self, tokens: Any) -> str:
        return self._tok.decode([int(t) for t in np.asarray(tokens).reshape(-1)])

    def decode_batch(self, sequences: list[Any]) -> list[str]:
        return [self.decode(s) for s in sequences]

    def create_stream(self) -> TokenizerStream:
        return TokenizerStream(self)


class TokenizerStream:
    """``decode(token)`` returns the text a new token adds (possibly "" while a character is incomplete).

    Re-decodes a short window so that multi-token characters and word-boundary spaces come out right.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window whose text was already emitted
        self._read = 0  # end of that window

    def decode(self, token: int) -> str:
        self._ids.append(int(token))
        before = self._tok.decode(self._ids[self._prefix:self._read])
        text = self._tok.decode(self._ids[self._prefix:])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(before):]
        return ""
