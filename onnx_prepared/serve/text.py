"""TextReplica: a genai model folder behind a replica, text in and a stream of tokens out.

The folder is onnxruntime-genai's (``genai_config.json``, the decoder, and ``tokenizer.json`` for text;
``onnx-prepared generate tiny-llm`` writes the first two). The decoder session is a ModelReplica's, so
it starts the same way (``prepare_async`` at start, the shared prepared cache) and also answers tensor
requests. Generation is :mod:`onnx_prepared.genai`'s loop; each step runs in a worker thread, so the
replica's event loop keeps serving other requests while a sequence decodes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from onnx_prepared.errors import InvalidFeedError
from onnx_prepared.serve.replica import ModelReplica, companion_path, session_options

#: Request fields passed to ``GeneratorParams.set_search_options`` as they are.
SEARCH_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "random_seed", "min_length")


def is_genai_folder(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "genai_config.json"))


class TextReplica(ModelReplica):
    """``async for piece in replica.generate({"prompt": "Once", "max_tokens": 16}): ...``

    A request holds ``prompt`` (text; needs ``tokenizer.json``) or ``tokens`` (ids), ``max_tokens``
    (default 32) and the search fields of :data:`SEARCH_FIELDS`. Each piece is
    ``{"token": id, "text": str | None}``.
    """

    def __init__(self, folder: str | os.PathLike, cache_path: str | os.PathLike | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        from onnx_prepared import genai as og
        from onnx_prepared.inference_session import InferenceSession

        config = og.load_config(folder)
        companion = None if cache_path is None else companion_path(config.model_path, cache_path)
        session = InferenceSession(config.model_path, session_options(options, companion=companion))
        self.model = og.Model(folder, session=session)
        self.tokenizer = og.Tokenizer(self.model) if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
        super().__init__(config.model_path, session=session.runtime)
        self.folder = os.fspath(folder)

    def _prompt(self, request: Mapping[str, Any]) -> list[int]:
        if "tokens" in request:
            try:
                ids = [int(t) for t in request["tokens"]]
            except (TypeError, ValueError):
                raise InvalidFeedError("'tokens' must be a list of token ids") from None
        elif "prompt" in request:
            if self.tokenizer is None:
                raise InvalidFeedError(f"{self.folder} has no tokenizer.json: send 'tokens' (ids), not 'prompt'")
            ids = [int(t) for t in self.tokenizer.encode(str(request["prompt"]))]
        else:
            raise InvalidFeedError("a generation request needs 'prompt' (text) or 'tokens' (ids)")
        vocab = self.model.config.vocab_size
        if not ids or (vocab and not all(0 <= t < vocab for t in ids)):
            raise InvalidFeedError(f"the prompt must be 1 or more token ids in [0, {vocab})")
        return ids

    async def generate(self, request: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        from onnx_prepared import genai as og

        ids = self._prompt(request)
        max_tokens = request.get("max_tokens", 32)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidFeedError(f"'max_tokens' must be an int >= 1, got {max_tokens!r}")
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + max_tokens,
                                  **{k: request[k] for k in SEARCH_FIELDS if k in request})
        gen = og.Generator(self.model, params)
        stream = None if self.tokenizer is None else self.tokenizer.create_stream()
        await asyncio.to_thread(gen.append_tokens, ids)
        while not gen.is_done():
            await asyncio.to_thread(gen.generate_next_token)
            token = int(gen.get_next_tokens()[0])
            yield {"token": token, "text": None if stream is None else stream.decode(token)}

    def status(self) -> dict[str, Any]:
        return {**super().status(), "folder": self.folder, "text": self.tokenizer is not None}
