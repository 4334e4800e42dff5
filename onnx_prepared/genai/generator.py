"""Model, GeneratorParams and Generator: onnxruntime-genai's decoding loop over our session.

Shaped like ``onnxruntime_genai`` so the common path switches with a changed import::

    import onnx_prepared.genai as og          # was: import onnxruntime_genai as og
    model = og.Model("model_dir")
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("Hello"))
    while not generator.is_done():
        generator.generate_next_token()
        print(stream.decode(generator.get_next_tokens()[0]), end="")

``append_tokens`` runs the model on the tokens (a prefill) and keeps the last position's logits;
``generate_next_token`` picks the next token from them (greedy unless ``do_sample``), and the following
call first runs the model on that token (a decode step with the KV cache).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from onnx_prepared.errors import InvalidFeedError, InvalidOptionError, OnnxPreparedError
from onnx_prepared.genai.config import SEARCH_DEFAULTS, GenaiConfig, load_config

_NP = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
       "tensor(float16)": np.float16, "tensor(bfloat16)": np.float32}


class Model:
    """A genai model folder: ``genai_config.json``, the decoder ONNX file and (for text) ``tokenizer.json``.

    ``options`` are the decoder session's :class:`~onnx_prepared.SessionOptions` (a prepared cache, a
    budget); ``session`` replaces our session by any object with onnxruntime's ``run`` / ``get_inputs`` /
    ``get_outputs`` (the tests drive onnxruntime through the same loop).
    """

    device_type = "cpu"

    def __init__(self, folder: str | os.PathLike, options: Any = None, *, session: Any = None):
        self.config: GenaiConfig = load_config(folder)
        self.folder = self.config.folder
        self.type = "decoder"
        if session is None:
            from onnx_prepared.inference_session import InferenceSession

            session = InferenceSession(self.config.model_path, options)
        self.session = session
        self._inputs = {i.name: i for i in session.get_inputs()}
        self._output_names = [o.name for o in session.get_outputs()]
        c = self.config
        missing = [n for n in [c.inputs["input_ids"], *c.past_names("key"), *c.past_names("value")]
                   if n not in self._inputs]
        if missing:
            raise InvalidFeedError(f"{c.model_path}: genai_config.json names inputs the model lacks: "
                                   + ", ".join(missing))

    def dtype_of(self, name: str) -> Any:
        return _NP.get(self._inputs[name].type, np.float32)

    def has_input(self, name: str) -> bool:
        return name in self._inputs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        return dict(zip(self._output_names, self.session.run(None, feeds)))

    def close(self) -> None:
        rt = getattr(self.session, "runtime", None)
        if rt is not None:
            rt.close()


class GeneratorParams:
    """Search options: genai_config.json's "search" section, overridden by :meth:`set_search_options`."""

    def __init__(self, model: Model):
        self.model = model
        self.search: dict[str, Any] = dict(model.config.search)

    def set_search_options(self, **options: Any) -> None:
        for name, value in options.items():
            if name not in SEARCH_DEFAULTS:
                raise InvalidOptionError(name, value, "a search option: " + ", ".join(SEARCH_DEFAULTS))
            if name == "do_sample" and not isinstance(value, bool):
                raise InvalidOptionError(name, value, "True or False")
            if name in ("max_length", "min_length", "top_k") and (isinstance(value, bool) or int(value) != value
                                                                   or value < (1 if name == "max_length" else 0)):
                raise InvalidOptionError(name, value, "a non-negative int" if name != "max_length" else "an int >= 1")
            if name == "top_p" and not 0.0 < float(value) <= 1.0:
                raise InvalidOptionError(name, value, "a float in (0, 1]")
            if name in ("temperature", "repetition_penalty") and not float(value) > 0.0:
                raise InvalidOptionError(name, value, "a float > 0")
            self.search[name] = value

    def get_search_options(self) -> dict[str, Any]:
        return dict(self.search)


class Generator:
    """One sequence (batch 1) being generated; see the module docstring for the call order."""

    def __init__(self, model: Model, params: GeneratorParams):
        self.model = model
        c = model.config
        self._search = dict(params.search)
        self._max_length = min(int(self._search["max_length"] or c.context_length), c.context_length or 1 << 31)
        self._tokens: list[int] = []
        self._next: list[int] = []  # chosen tokens whose logits are not computed yet
        self._logits: np.ndarray | None = None
        seed = int(self._search.get("random_seed", -1))
        self._rng = np.random.default_rng(None if seed < 0 else seed)
        kv = [c.kv_heads, 0, c.head_size]
        self._past = {n: np.zeros([1, *kv], model.dtype_of(n)) for n in c.past_names("key") + c.past_names("value")}
        self._past_len = 0
        self._done = False
        self.prompt_length = 0

    # **** onnxruntime-genai's methods ****

    def append_tokens(self, tokens: Any) -> None:
        """Run the model on ``tokens`` (1-D or [1, n]) and keep the last position's logits."""
        ids = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if not ids:
            raise InvalidFeedError("append_tokens: no tokens")
        if self._done:
            raise OnnxPreparedError("append_tokens: generation is done (is_done() is True)")
        self._tokens += ids  # a chosen token whose logits were never computed (self._next) runs first
        run, self._next = self._next + ids, []
        if not self.prompt_length:
            self.prompt_length = len(self._tokens)
        ids = run
        self._forward(ids)

    def generate_next_token(self) -> None:
        if self._done:
            raise OnnxPreparedError("generate_next_token: generation is done (is_done() is True)")
        if self._logits is None:
            if not self._next:
                raise OnnxPreparedError("generate_next_token: call append_tokens first")
            self._forward(self._next)
        token = self._select(self._logits)
        self._tokens.append(token)
        self._next, self._logits = [token], None
        generated = len(self._tokens) - self.prompt_length
        eos = token in self.model.config.eos_token_ids and generated >= int(self._search["min_length"])
        self._done = eos or len(self._tokens) >= self._max_length

    def get_next_tokens(self) -> np.ndarray:
        return np.asarray(self._next, dtype=np.int32)

    def is_done(self) -> bool:
        return self._done

    def get_sequence(self, index: int = 0) -> np.ndarray:
        if index != 0:
            raise InvalidFeedError(f"get_sequence({index}): this generator holds one sequence (index 0)")
        return np.asarray(self._tokens, dtype=np.int32)

    def get_logits(self) -> np.ndarray:
        """The logits the next token is chosen from, [1, vocab]."""
        if self._logits is None and self._next:
            self._forward(self._next)
        if self._logits is None:
            raise OnnxPreparedError("get_logits: call append_tokens first")
        return self._logits[None]

    def token_count(self) -> int:
        return len(self._tokens)

    # **** one forward and the search ****

    def _forward(self, ids: list[int]) -> None:
        c, m = self.model.config, self.model
        total = self._past_len + len(ids)
        if c.context_length and total > c.context_length:
            raise InvalidFeedError(f"{total} tokens exceed the model's context length {c.context_length}")
        name = c.inputs["input_ids"]
        feeds = {name: np.asarray([ids], m.dtype_of(name))}
        mask = c.inputs.get("attention_mask")
        if mask and m.has_input(mask):
            feeds[mask] = np.ones((1, total), m.dtype_of(mask))
        pos = c.inputs.get("position_ids", "position_ids")
        if m.has_input(pos):
            feeds[pos] = np.arange(self._past_len, total, dtype=m.dtype_of(pos))[None]
        feeds |= self._past
        out = m.run(feeds)
        self._logits = np.asarray(out[c.outputs["logits"]][0, -1], dtype=np.float32)
        for kind in ("key", "value"):
            for past, present in zip(c.past_names(kind), c.present_names(kind)):
                self._past[past] = out[present]
        self._past_len = total

    def _select(self, logits: np.ndarray) -> int:
        s = self._search
        logits = logits.astype(np.float32, copy=True)
        penalty = float(s["repetition_penalty"])
        if penalty != 1.0 and self._tokens:
            seen = np.fromiter(set(self._tokens), np.int64)  # np.unique's first call imports numpy.ma (12-16 ms)
            vals = logits[seen]
            logits[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
        if not s["do_sample"]:
            return int(np.argmax(logits))
        logits /= float(s["temperature"])
        k = int(s["top_k"])
        if 0 < k < logits.size:
            cut = np.partition(logits, -k)[-k]
            logits[logits < cut] = -np.inf
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top_p = float(s["top_p"])
        if top_p < 1.0:
            order = np.argsort(-probs)
            keep = np.cumsum(probs[order]) - probs[order] < top_p  # always keeps the most likely token
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[keep]] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        return int(self._rng.choice(probs.size, p=probs))
