"""Cache-line-aligned buffers: numpy's large buffers start 16 bytes into a page, so a 64-byte load of
packed weights in a plain ``np.empty`` straddles two lines. Packs and payloads copied out of the
prepared cache both allocate here (a mapped payload is aligned by the companion's writer)."""

from __future__ import annotations

import numpy as np

#: bytes: whole cache lines. 1 thread, thread CPU, the same weights at offsets 0 and 16 in one process:
#: MatMulNBits M=16 2816x1024 level 4 -4.7 %, M=128 1024x3072 -2.3 %, M=1 1024x1024 (weights in cache) -22 %
ALIGN = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """A new uint8 buffer of ``nbytes`` starting on an :data:`ALIGN`-byte boundary (a view of one
    ``ALIGN`` bytes larger)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off: off + nbytes]
