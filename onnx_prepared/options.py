"""SessionOptions: onnxruntime's options object plus the prepared-execution settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SessionOptions:
    """Settings of a session. Unknown onnxruntime options are accepted and ignored, so ORT code runs as is.

    >>> so = SessionOptions()
    >>> so.prepared_model_policy = "build_if_missing"   # persist prepacked weights for the next process
    >>> sess = InferenceSession("model.onnx", so)
    """

    #: CPU workers of the session scheduler (0: one per core, at most 2 by default).
    intra_op_num_threads: int = 0
    #: OpenBLAS threads per GEMM on the hot path (None: OpenBLAS's default, one per core). The default 1
    #: leaves the other core to the session's second worker and to background work: multi-threaded
    #: GEMMs next to any other busy thread ran several times slower here. Cold runs always use 1.
    blas_threads: int | None = 1
    #: bounded I/O workers for external-data and cache reads
    io_workers: int = 4
    #: companion prepared model: "disabled", "read_only", "build_if_missing" or "require_complete"
    prepared_model_policy: str = "disabled"
    #: companion model path (default: a per-user cache folder keyed by the model's identity)
    prepared_model_path: str | None = None
    #: bytes of resident prepared objects (PreparedArena); None = unlimited
    prepared_memory_limit: int | None = None
    #: retained free bytes kept per arena ("preparation", "prepared", "execution", "io"); beyond it freed
    #: capacity is trimmed (the accounting of what an allocator would keep for reuse)
    arena_retention_caps: dict[str, int] | None = None
    #: global byte budget of the scheduler's memory admission; None = unlimited
    memory_limit: int | None = None
    #: record a per-task trace (``session.scheduler.trace``), exportable to Perfetto
    trace: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
