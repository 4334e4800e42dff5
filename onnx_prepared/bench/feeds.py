"""Feeds for any model from its declared inputs: an LLM prefill (ids, mask, empty KV cache) or random tensors."""

from __future__ import annotations

import numpy as np

_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def make_feeds(model_path: str, tokens: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """One array per graph input (initializer-backed inputs excluded).

    Symbolic dims: names with "past" are 0 (an empty KV cache), names with "seq" or "total" are ``tokens``,
    others 1. ``input_ids`` get deterministic ids, ``attention_mask`` ones, ``position_ids`` 0..tokens-1.
    """
    import onnx

    from onnx_prepared.errors import InvalidFeedError

    m = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        if not i.type.HasField("tensor_type") or tt.elem_type not in _DTYPES:
            raise InvalidFeedError(f"input {i.name!r}: bench makes feeds for plain tensors only; pass --feeds")
        shape = []
        for d in tt.shape.dim:
            p = d.dim_param.lower()
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            elif "past" in p:
                shape.append(0)
            elif "seq" in p or "total" in p:
                shape.append(tokens)
            else:
                shape.append(1)
        dt = _DTYPES[tt.elem_type]
        if i.name == "input_ids":
            feeds[i.name] = (np.arange(int(np.prod(shape)), dtype=np.int64) * 7919 % 1000 + 3).reshape(shape)
            feeds[i.name] = feeds[i.name].astype(dt)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones(shape, dt)
        elif i.name == "position_ids":
            feeds[i.name] = np.broadcast_to(np.arange(shape[-1], dtype=dt), shape).copy()
        elif np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif dt is np.bool_:
            feeds[i.name] = np.ones(shape, dt)
        else:
            feeds[i.name] = np.zeros(shape, dt)
    return feeds
