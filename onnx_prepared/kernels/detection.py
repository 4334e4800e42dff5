"""TopK and NonMaxSuppression, ordered exactly as onnxruntime orders them.

TopK: ties keep the lower index first (a stable sort on a monotone key: ``-x`` for floats, ``~x`` for
integers, which cannot overflow); NaN counts as the largest value.
NonMaxSuppression: per (batch, class), candidates above
``score_threshold`` in descending score (equal scores: lower box index first), greedily kept unless
their IoU with a kept box exceeds ``iou_threshold``; boxes of zero area never suppress.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel


def _topk(x: np.ndarray, k: int, axis: int, largest: int, sorted_: int) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        raise KernelError("TopK: input must have at least one axis")
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < x.ndim:
        raise KernelError(f"TopK: axis={axis} out of range for rank {x.ndim}")
    n = x.shape[a]
    if not 0 <= k <= n:
        raise KernelError(f"TopK: k={k} is not in [0, {n}] (input shape {list(x.shape)}, axis {axis})")
    if largest:
        key = -x if x.dtype.kind == "f" else ~x
    else:
        key = x
    if largest and x.dtype.kind == "f" and np.isnan(x).any():
        key = np.where(np.isnan(x), -np.inf, key)  # onnxruntime ranks NaN above every number
    if 0 < k < n // 8 and x.size == n:
        # one row, few wanted (a detector's top-k): partition, then stable-sort the k best and their ties
        flat = key.reshape(-1)
        kth = flat[np.argpartition(flat, k - 1)[k - 1]]
        cand = np.flatnonzero(flat <= kth)
        idx = cand[np.argsort(flat[cand], kind="stable")[:k]].reshape(x.shape[:a] + (k,) + x.shape[a + 1:])
    else:
        idx = np.take(np.argsort(key, axis=a, kind="stable"), np.arange(k), axis=a)
    return np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)


@kernel("TopK", since=1)
def topk_1(X: np.ndarray, *, axis: int = -1, k: int) -> tuple[np.ndarray, np.ndarray]:
    return _topk(X, int(k), axis, 1, 1)


@kernel("TopK", since=10)
def topk_10(X: np.ndarray, K: np.ndarray, *, axis: int = -1, largest: int = 1,
            sorted: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``sorted=0`` returns the sorted order too: the spec allows any order, and onnxruntime's (a heap's)
    is an implementation detail; the selected set is the same."""
    if np.size(K) != 1:
        raise KernelError(f"TopK: K must hold one value, got shape {list(np.shape(K))}")
    return _topk(X, int(np.asarray(K).reshape(-1)[0]), axis, largest, sorted)


def _greedy_native(coords: np.ndarray, s: np.ndarray, cand: np.ndarray, max_out: int, iou_t: float) -> np.ndarray:
    """The kept boxes of one (batch, class), in C; only a prefix of the score order is sorted first.

    The greedy pass usually keeps ``max_out`` boxes long before the last candidate, so the best
    ``4 * max_out`` candidates (and every tie of the last one) are sorted stably, and the full order is
    sorted only when that prefix did not yield ``max_out`` boxes. The prefix is exactly the head of the
    full order (ties included), so the selection is the same.
    """
    key = -s[cand]
    head = 4 * max_out
    if head < cand.shape[0] // 2:
        kth = np.partition(key, head - 1)[head - 1]
        part = np.flatnonzero(key <= kth)
        order = cand[part[np.argsort(key[part], kind="stable")]].astype(np.int64)
        kept = native.nms_greedy(coords, order, max_out, iou_t)
        if kept.shape[0] >= max_out:
            return kept
    order = cand[np.argsort(key, kind="stable")].astype(np.int64)
    return native.nms_greedy(coords, order, max_out, iou_t)


@kernel("NonMaxSuppression", since=10)
def non_max_suppression(
    boxes: np.ndarray, scores: np.ndarray, max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None, score_threshold: np.ndarray | None = None, *,
    center_point_box: int = 0,
) -> tuple[np.ndarray]:
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise KernelError(f"NonMaxSuppression: boxes {list(boxes.shape)} must be [B, N, 4] and scores "
                          f"{list(scores.shape)} [B, C, N]")
    max_out = 0 if max_output_boxes_per_class is None or np.size(max_output_boxes_per_class) == 0 else int(
        np.asarray(max_output_boxes_per_class).reshape(-1)[0])
    iou_t = 0.0 if iou_threshold is None or np.size(iou_threshold) == 0 else float(
        np.asarray(iou_threshold).reshape(-1)[0])
    score_t = None if score_threshold is None or np.size(score_threshold) == 0 else float(
        np.asarray(score_threshold).reshape(-1)[0])
    if max_out <= 0 or boxes.shape[1] == 0:
        return (np.zeros((0, 3), np.int64),)
    b = boxes.astype(np.float32, copy=False)
    if center_point_box:
        half_w, half_h = b[..., 2] / 2, b[..., 3] / 2
        x1, x2 = b[..., 0] - half_w, b[..., 0] + half_w
        y1, y2 = b[..., 1] - half_h, b[..., 1] + half_h
    else:
        y1, y2 = np.minimum(b[..., 0], b[..., 2]), np.maximum(b[..., 0], b[..., 2])
        x1, x2 = np.minimum(b[..., 1], b[..., 3]), np.maximum(b[..., 1], b[..., 3])
    area = (y2 - y1) * (x2 - x1)
    # the greedy pass runs in C (native.nms_greedy) on [B, 5, N] corners + areas; the loop below is its
    # numpy twin (no extension) and its oracle in the tests
    coords = np.ascontiguousarray(np.stack([y1, x1, y2, x2, area], axis=1), np.float32) if native.available() \
        else None
    out = []
    for bi in range(boxes.shape[0]):
        for ci in range(scores.shape[1]):
            s = scores[bi, ci].astype(np.float32, copy=False)
            cand = np.arange(s.shape[0]) if score_t is None else np.nonzero(s > score_t)[0]
            if coords is None:
                order = cand[np.argsort(-s[cand], kind="stable")]
            else:
                kept = _greedy_native(coords[bi], s, cand, max_out, iou_t)
                sel = np.empty((kept.shape[0], 3), np.int64)
                sel[:, 0], sel[:, 1], sel[:, 2] = bi, ci, kept
                out.append(sel)
                continue
            kept = []
            while order.size and len(kept) < max_out:
                i = order[0]
                kept.append(i)
                rest = order[1:]
                ih = np.minimum(y2[bi, i], y2[bi, rest]) - np.maximum(y1[bi, i], y1[bi, rest])
                iw = np.minimum(x2[bi, i], x2[bi, rest]) - np.maximum(x1[bi, i], x1[bi, rest])
                inter = np.maximum(ih, 0) * np.maximum(iw, 0)
                union = area[bi, i] + area[bi, rest] - inter
                valid = (area[bi, i] > 0) & (area[bi, rest] > 0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    iou = np.where(valid, inter / np.where(union > 0, union, 1), 0)
                order = rest[~(iou > iou_t)]
            out.append(np.array([(bi, ci, int(i)) for i in kept], np.int64).reshape(-1, 3))
    return (np.concatenate(out) if out else np.zeros((0, 3), np.int64),)
