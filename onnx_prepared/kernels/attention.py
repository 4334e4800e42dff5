"""com.microsoft GroupQueryAttention (CPU semantics of onnxruntime), float KV cache.

Shapes: query ``[B, S, num_heads * H]`` (or packed QKV ``[B, S, (num_heads + 2 * kv_num_heads) * H]``
with key/value omitted), key/value ``[B, S, kv_num_heads * H]``, past/present KV ``[B, kv_num_heads, L, H]``
(BNSH). ``seqlens_k[b]`` is the batch entry's total length minus one; ``total_sequence_length`` is the batch
maximum. The call is the *first prompt* when ``S == total_sequence_length``: entry ``b`` then has no past
and ``seqlens_k[b] + 1`` valid (right-padded) tokens. Otherwise entry ``b`` has
``past_b = seqlens_k[b] + 1 - S`` cached tokens and appends S new ones at ``[past_b, past_b + S)``.

present has ``max(L_past, total_sequence_length)`` positions (genai shares one buffer for past and
present): entry ``b``'s valid past rows are copied, the S new K/V rows written after them (all S of a
first prompt, padding included), zeros after those, as onnxruntime writes it. Query head ``h`` reads
KV head ``h // (num_heads // kv_num_heads)``. Scores ``scale * q.k`` (+ attention_bias), then softcap
``c * tanh(x / c)``, causal (and ``local_window_size``) masking, softmax (``smooth_softmax`` / ``head_sink``
add a sink logit, 0 or ``head_sink[h]``, to the denominator), then the weighted sum of V.

Unsupported (clear KernelError): quantized KV caches (k_scale/v_scale), ``query_seqlens``,
``q_norm_weight``/``k_norm_weight`` (onnxruntime's CPU provider rejects them too), ``sliding_window_cache=1``.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel
from onnx_prepared.kernels.rotary import apply_rotary

_OP = "GroupQueryAttention"


def _fail(msg: str) -> KernelError:
    return KernelError(f"{_OP}: {msg}")


ORDER_ENV = "ONNX_PREPARED_GQA_ORDER"
#: the native call's exp8 flag of each order: MLAS's AVX-512F sum-exp kernel (16 lanes, scalef) or its AVX2
#: (FMA3) one (8 lanes, exp below about -87.3 flushed to 0); everything else in the two orders is the same
GQA_ORDERS = {"avx512": 0, "avx2": 1}


@functools.cache
def gqa_order() -> str:
    """Whose softmax order the native GroupQueryAttention follows: ``ONNX_PREPARED_GQA_ORDER`` or the one
    onnxruntime's MLAS picks on this CPU (AVX-512F or not; ``_native/attention.c`` gqa_cpu_order).

    Read once per process, as ``matmul_nbits.int8_order`` (tests that set the variable call
    ``gqa_order.cache_clear()``)."""
    forced = os.environ.get(ORDER_ENV)
    if forced:
        if forced not in GQA_ORDERS:
            raise KernelError(f"{ORDER_ENV}={forced!r} is not a GroupQueryAttention order (one of "
                              f"{', '.join(GQA_ORDERS)})")
        return forced
    if native._ext is None:
        return "avx512"
    return "avx2" if native._ext.gqa_cpu_order() else "avx512"


@kernel("GroupQueryAttention", since=1, domain="com.microsoft")
def group_query_attention(
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    seqlens_k: np.ndarray | None = None,
    total_sequence_length: np.ndarray | None = None,
    cos_cache: np.ndarray | None = None,
    sin_cache: np.ndarray | None = None,
    position_ids: np.ndarray | None = None,
    attention_bias: np.ndarray | None = None,
    head_sink: np.ndarray | None = None,
    k_scale: np.ndarray | None = None,
    v_scale: np.ndarray | None = None,
    q_norm_weight: np.ndarray | None = None,
    k_norm_weight: np.ndarray | None = None,
    query_seqlens: np.ndarray | None = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    do_rotary: int = 0,
    rotary_interleaved: int = 0,
    local_window_size: int = -1,
    smooth_softmax: int = -1,
    qk_output: int = 0,
    causal: int = 1,
    sliding_window_cache: int = 0,
    kv_cache_bit_width: int = 0,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    qk_norm_epsilon: float = 1e-6,
    q_norm_epsilon: float = 0.0,
    k_norm_epsilon: float = 0.0,
) -> tuple[np.ndarray, ...]:
    """GroupQueryAttention -> (output, present_key, present_value[, output_qk])."""
    if k_scale is not None or v_scale is not None or k_quant_type != "NONE" or v_quant_type != "NONE":
        raise _fail("quantized KV caches (k_scale/v_scale, k_quant_type/v_quant_type) are not supported")
    if q_norm_weight is not None or k_norm_weight is not None:
        raise _fail("q_norm_weight/k_norm_weight are not supported (nor by onnxruntime's CPU provider)")
    if query_seqlens is not None:
        raise _fail("the query_seqlens input (right-padded chunks) is not supported")
    if sliding_window_cache:
        raise _fail("sliding_window_cache=1 is not supported")
    if seqlens_k is None or total_sequence_length is None:
        raise _fail("seqlens_k and total_sequence_length are required")
    if num_heads <= 0 or kv_num_heads <= 0 or num_heads % kv_num_heads:
        raise _fail(f"num_heads={num_heads} must be a positive multiple of kv_num_heads={kv_num_heads}")
    if query.ndim != 3:
        raise _fail(f"query must be 3-D [batch, seq, hidden], got shape {list(query.shape)}")
    b, s, d = query.shape
    if key is None:  # packed QKV
        if value is not None:
            raise _fail("value given without key")
        h = d // (num_heads + 2 * kv_num_heads)
        if h * (num_heads + 2 * kv_num_heads) != d:
            raise _fail(f"packed QKV width {d} is not a multiple of num_heads + 2 * kv_num_heads")
        q = query[..., : num_heads * h]
        k = query[..., num_heads * h: (num_heads + kv_num_heads) * h]
        v = query[..., (num_heads + kv_num_heads) * h:]
    else:
        if value is None:
            raise _fail("key given without value")
        h = d // num_heads
        q, k, v = query, key, value
        if k.shape != (b, s, kv_num_heads * h) or v.shape != k.shape:
            raise _fail(f"key/value must be [batch, {s}, {kv_num_heads * h}], got {list(k.shape)} {list(v.shape)}")
    dtype = query.dtype
    if (native._ext is not None and dtype == np.float32 and attention_bias is None and qk_output not in (1, 2)
            and (key is None or (key.dtype == np.float32 and value.dtype == np.float32))
            and (past_key is None or (past_key.dtype == np.float32 and past_value is not None
                                      and past_value.dtype == np.float32 and past_value.shape == past_key.shape))
            and (not do_rotary or (cos_cache is not None and sin_cache is not None and cos_cache.ndim == 2
                                   and cos_cache.dtype == np.float32 and sin_cache.dtype == np.float32
                                   and sin_cache.shape == cos_cache.shape))
            and (head_sink is None or (head_sink.dtype == np.float32 and head_sink.size == num_heads))):
        return _native_gqa(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                           sin_cache, position_ids, head_sink, b, s, h, num_heads, kv_num_heads, scale, softcap,
                           do_rotary, rotary_interleaved, local_window_size, smooth_softmax, causal)
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    # Per-entry lengths as Python ints: a decode step's checks then cost no numpy calls.
    seqlens = [int(x) for x in np.asarray(seqlens_k).reshape(-1).tolist()]
    if len(seqlens) != b:
        raise _fail(f"seqlens_k has {len(seqlens)} entries for batch {b}")
    first_prompt = s == total
    past_len = [0] * b if first_prompt else [x + 1 - s for x in seqlens]
    if min(past_len) < 0 or max(seqlens) + 1 > total:
        raise _fail(f"seqlens_k {seqlens} inconsistent with sequence length {s} and total {total}")
    l_past = 0 if past_key is None else past_key.shape[2]
    if not first_prompt and max(past_len) > l_past:
        raise _fail(f"past_key holds {l_past} positions, fewer than the past lengths {past_len}")
    present_len = max(l_past, total)

    # NOTE: copy=False throughout: the float32 path (every LLM export) must not copy the KV cache per call.
    qh = q.reshape(b, s, num_heads, h).astype(np.float32, copy=False)
    kh = k.reshape(b, s, kv_num_heads, h).astype(np.float32, copy=False)
    vh = v.reshape(b, s, kv_num_heads, h).astype(np.float32, copy=False)
    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise _fail("do_rotary=1 needs cos_cache and sin_cache")
        if position_ids is None:
            pos = np.array(past_len, np.int64)[:, None] + np.arange(s, dtype=np.int64)[None, :]
        elif first_prompt:  # onnxruntime reads only the first element for the first prompt
            pos = int(np.asarray(position_ids).reshape(-1)[0]) + np.arange(s, dtype=np.int64)[None, :].repeat(b, 0)
        else:
            pos = np.asarray(position_ids).astype(np.int64).reshape(b, s)
        if pos.max(initial=0) >= cos_cache.shape[0]:
            raise _fail(f"rotary position {int(pos.max())} exceeds the cos/sin cache ({cos_cache.shape[0]} rows)")
        cos = cos_cache[pos][:, :, None, :]
        sin = sin_cache[pos][:, :, None, :]
        if key is None and q.dtype == np.float32:  # packed QKV: Q and K heads are adjacent, rotate them at once
            qk = apply_rotary(query[..., : (num_heads + kv_num_heads) * h].reshape(b, s, num_heads + kv_num_heads, h),
                              cos, sin, bool(rotary_interleaved))
            qh, kh = qk[:, :, :num_heads], qk[:, :, num_heads:]
        else:
            qh = apply_rotary(qh, cos, sin, bool(rotary_interleaved))
            kh = apply_rotary(kh, cos, sin, bool(rotary_interleaved))

    # present as onnxruntime writes it: entry i's past_len[i] past rows, the s new rows after them (all s
    # for a first prompt, padding included), zeros after those (np.empty: each byte once)
    present_k = np.empty((b, kv_num_heads, present_len, h), dtype)
    present_v = np.empty((b, kv_num_heads, present_len, h), dtype)
    for i in range(b):
        p0 = past_len[i]
        if p0:
            present_k[i, :, :p0] = past_key[i, :, :p0]
            present_v[i, :, :p0] = past_value[i, :, :p0]
        present_k[i, :, p0 + s:] = 0
        present_v[i, :, p0 + s:] = 0
    scale_ = np.float32(scale if scale else 1.0 / np.sqrt(h))
    group = num_heads // kv_num_heads
    out = np.empty((b, s, num_heads, h), np.float32)
    want_qk = qk_output in (1, 2)
    qk_out = np.zeros((b, num_heads, s, total), np.float32) if want_qk else None
    for i in range(b):
        p0 = past_len[i]
        t = seqlens[i] + 1
        present_k[i, :, p0: p0 + s] = kh[i].transpose(1, 0, 2)
        present_v[i, :, p0: p0 + s] = vh[i].transpose(1, 0, 2)
        keys = present_k[i, :, :t].astype(np.float32, copy=False)  # [kvh, t, h]
        vals = present_v[i, :, :t].astype(np.float32, copy=False)
        qi = qh[i].transpose(1, 0, 2)  # [heads, s, h]; head = kv * group + g
        # Causal prompts in query chunks: chunk [j0, j1) reads only the keys [0, p0 + j1), so the masked
        # upper triangle is neither multiplied, exponentiated nor summed (about half the work at s = 128).
        chunk = s if not causal or s <= _CHUNK or attention_bias is not None or want_qk else _CHUNK
        for j0 in range(0, s, chunk):
            j1 = min(s, j0 + chunk)
            tj = min(t, p0 + j1) if chunk < s else t
            out[i, j0:j1] = _attend(qi[:, j0:j1], keys[:, :tj], vals[:, :tj], p0 + j0, group, scale_, softcap,
                                    bool(causal), local_window_size, head_sink, smooth_softmax > 0,
                                    None if attention_bias is None else _bias(attention_bias, i, s, total, t),
                                    qk_out[i] if want_qk else None, qk_output)
    res = (out.reshape(b, s, num_heads * h).astype(dtype, copy=False), present_k, present_v)
    if want_qk:
        res += (qk_out.astype(dtype, copy=False),)
    return res


_CHUNK = 64  # query rows per causal chunk of a prompt


def _native_gqa(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
                position_ids, head_sink, b, s, h, num_heads, kv_num_heads, scale, softcap, do_rotary, interleaved,
                window, smooth, causal):
    """The float32 call through the extension (``_native/attention.c``): same semantics as the numpy code
    below, which keeps attention_bias, qk_output and other dtypes. The C entry checks every length and
    position against the buffers."""
    c = np.ascontiguousarray
    total = int(total_sequence_length.item(0)) if isinstance(total_sequence_length, np.ndarray) \
        else int(np.asarray(total_sequence_length).reshape(-1)[0])
    l_past = 0 if past_key is None else past_key.shape[2]
    if past_key is not None and (past_key.ndim != 4 or past_key.shape[0] != b or past_key.shape[1] != kv_num_heads
                                 or past_key.shape[3] != h):
        raise _fail(f"past_key must be [{b}, {kv_num_heads}, L, {h}], got {list(past_key.shape)}")
    seqlens = seqlens_k if seqlens_k.dtype == np.int32 else seqlens_k.astype(np.int32)
    if seqlens.size != b:
        raise _fail(f"seqlens_k has {seqlens.size} entries for batch {b}")
    present_len = max(l_past, total)
    half = rows = pos0 = 0
    pos = None
    mode = 0
    if do_rotary:
        rows, half = cos_cache.shape
        if 2 * half > h:
            raise _fail(f"rotary cache width {half} exceeds half the head size {h}")
        if position_ids is not None:
            if s == total:  # onnxruntime reads only the first element for the first prompt
                mode, pos0 = 1, int(np.asarray(position_ids).reshape(-1)[0])
            else:
                pos = c(np.asarray(position_ids), dtype=np.int64)
                if pos.size != b * s:
                    raise _fail(f"position_ids has {pos.size} entries, expected {b * s}")
                mode = 2
    if head_sink is None and smooth > 0:
        head_sink = np.zeros(num_heads, np.float32)
    present_k = np.empty((b, kv_num_heads, present_len, h), np.float32)
    present_v = np.empty((b, kv_num_heads, present_len, h), np.float32)
    out = np.empty((b, s, num_heads * h), np.float32)
    try:
        native._ext.gqa(c(query), None if key is None else c(key), None if key is None else c(value),
                        None if past_key is None else c(past_key), None if past_key is None else c(past_value),
                        c(seqlens), c(cos_cache) if do_rotary else None, c(sin_cache) if do_rotary else None, pos,
                        None if head_sink is None else c(head_sink), present_k, present_v, out,
                        b, s, num_heads, kv_num_heads, h, l_past, present_len, total, int(bool(causal)),
                        int(window), int(bool(interleaved)), half, rows, mode, pos0, GQA_ORDERS[gqa_order()],
                        float(scale if scale else 1.0 / np.sqrt(h)), float(softcap))
    except ValueError as e:
        raise _fail(str(e)) from None
    return out, present_k, present_v


def _bias(attention_bias: np.ndarray, i: int, s: int, total: int, t: int) -> np.ndarray:
    bias = np.broadcast_to(attention_bias, (attention_bias.shape[0], attention_bias.shape[1], s, total))
    return bias[min(i, bias.shape[0] - 1), :, :, :t].astype(np.float32)


def _attend(q, keys, vals, q0, group, scale, softcap, causal, window, head_sink, smooth, bias, qk_out, qk_output):
    """Attention of queries ``q [heads, n, h]`` at positions ``q0..q0+n-1`` over ``keys/vals [kvh, t, h]``;
    returns ``[n, heads, h]``. ``qk_out [heads, s, total]`` (when wanted: the prompt is then one chunk)
    receives rows ``0..n-1``."""
    heads, n, h = q.shape
    kvh, t = keys.shape[0], keys.shape[1]
    scores = np.matmul(q.reshape(kvh, group * n, h), keys.transpose(0, 2, 1)).reshape(heads, n, t)
    scores *= scale
    if bias is not None:
        scores += bias
    if softcap > 0:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    # Query j sits at q0 + j: keys after q0 exist only in a prompt chunk (a decode step, n == 1 and key t - 1
    # = q0, masks nothing unless a window does).
    windowed = causal and window > 0 and q0 + n - 1 >= window
    mask = None
    if causal and (t - 1 > q0 or windowed):
        qpos = q0 + np.arange(n)[:, None]
        kpos = np.arange(t)[None, :]
        mask = kpos > qpos
        if windowed:
            mask |= kpos <= qpos - window
    if qk_out is not None and qk_output == 1:  # onnxruntime leaves masked entries at 0
        qk_out[:, :n, :t] = scores if mask is None else np.where(mask, np.float32(0), scores)
    if mask is not None:  # one [n, t] additive bias broadcast over heads (boolean assignment is ~4x slower)
        scores += np.where(mask, np.float32(-np.inf), np.float32(0))
    probs = _softmax(scores, head_sink, smooth)
    if qk_out is not None and qk_output == 2:
        qk_out[:, :n, :t] = probs
    ctx = np.matmul(probs.reshape(kvh, group * n, t), vals)  # [kvh, g*n, h]
    return ctx.reshape(heads, n, h).transpose(1, 0, 2)


def _softmax(x: np.ndarray, head_sink: np.ndarray | None, smooth: bool) -> np.ndarray:
    """Softmax over the last axis of ``[heads, s, t]``, in place; a sink logit adds ``exp(sink)`` to the
    denominator. (ufunc ``reduce`` directly: ``np.max``/``np.sum`` wrappers cost ~2 us per call.)"""
    m = np.maximum.reduce(x, axis=-1, keepdims=True)
    if head_sink is not None or smooth:
        sink = (np.zeros(x.shape[0], np.float32) if head_sink is None else head_sink.astype(np.float32))
        sink = sink[:, None, None]
        m = np.maximum(m, sink)
        x -= m
        np.exp(x, out=x)
        x /= np.add.reduce(x, axis=-1, keepdims=True) + np.exp(sink - m)
        return x
    x -= m
    np.exp(x, out=x)
    x /= np.add.reduce(x, axis=-1, keepdims=True)
    return x
