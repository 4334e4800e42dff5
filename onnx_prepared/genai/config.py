"""``genai_config.json``: what a model folder says about its decoder (input/output names, KV cache shape,
end-of-sequence ids, context length) and its default search options."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from onnx_prepared.errors import ModelLoadError

CONFIG_FILE = "genai_config.json"
#: search options of genai_config.json's "search" section that this package honours, with their defaults
SEARCH_DEFAULTS: dict[str, Any] = {"max_length": None, "min_length": 0, "do_sample": False, "top_k": 50,
                                   "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0,
                                   "random_seed": -1}


@dataclass(frozen=True)
class GenaiConfig:
    """The decoder description of one model folder."""

    folder: str
    filename: str
    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    inputs: dict[str, str]
    outputs: dict[str, str]
    search: dict[str, Any] = field(default_factory=dict)

    @property
    def model_path(self) -> str:
        return os.path.join(self.folder, self.filename)

    def past_names(self, kind: str) -> list[str]:
        """``past_key_values.%d.key`` ... for every layer (``kind`` "key" or "value")."""
        return [self.inputs[f"past_{kind}_names"] % i for i in range(self.layers)]

    def present_names(self, kind: str) -> list[str]:
        return [self.outputs[f"present_{kind}_names"] % i for i in range(self.layers)]


def load_config(folder: str | os.PathLike) -> GenaiConfig:
    """Read ``folder/genai_config.json``; a missing file or field raises ModelLoadError naming it."""
    folder = os.fspath(folder)
    path = os.path.join(folder, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{folder} is not a genai model folder: it has no {CONFIG_FILE}") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not readable JSON ({e})") from None
    try:
        m = raw["model"]
        d = m["decoder"]
        eos = m.get("eos_token_id", [])
        eos = tuple(eos) if isinstance(eos, list) else (int(eos),)
        inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
                  "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
        inputs |= d.get("inputs", {})
        outputs = {"logits": "logits", "present_key_names": "present.%d.key",
                   "present_value_names": "present.%d.value"} | d.get("outputs", {})
        search = {k: raw.get("search", {}).get(k, v) for k, v in SEARCH_DEFAULTS.items()}
        context = int(m.get("context_length") or search["max_length"] or 0)
        if search["max_length"] is None:
            search["max_length"] = context
        return GenaiConfig(folder, d["filename"], int(d["num_hidden_layers"]), int(d["num_key_value_heads"]),
                           int(d["head_size"]), int(m.get("vocab_size", 0)), context, eos,
                           m.get("bos_token_id"), m.get("pad_token_id"), inputs, outputs, search)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: missing or invalid field {e}") from None
