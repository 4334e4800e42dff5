"""A cold run's first rows, asked for when the run is submitted.

An LLM's first node gathers the prompt's rows of a row table (resolve/rows.py) by the ``input_ids`` feed.
The kernel asks for them (``RowView.hint``) when it runs, by then behind the reads the run's producers
started meanwhile: on a companion hit, four I/O workers mapping and hashing the first layers' payloads
and the read-ahead's pieces (the first Gather's 16 rows of an fp32 embedding took 2.6-13.8 ms there,
3.5-5.6 on a miss). Asked for before the producers start, they queue first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_prepared.resolve.rows import _ROW_OPS, RowView  # the ops that gather rows (table positions, indices)


def feed_gathers(plan: Any, views: dict[str, RowView]) -> tuple[tuple[int, tuple[RowView, ...]], ...]:
    """(indices slot, the node's row views) per node of ``plan`` that gathers rows of a table in ``views``
    (source name -> its view) by a graph input, directly."""
    r, ex = plan.resolved, plan.execution
    if not views or not r.node_meta or len(r.node_io) != len(r.node_meta):
        return ()
    slots = {n: i for i, n in enumerate(ex.slot_names)}
    inputs = {ex.slot_names[i] for i in ex.input_slots}
    out = []
    for (_, domain, op), (ins, _) in zip(r.node_meta, r.node_io):
        spec = _ROW_OPS.get(("" if domain in ("", "ai.onnx") else domain, op))
        if spec is None:
            continue
        positions, idx = spec
        if idx >= len(ins) or ins[idx] not in inputs:
            continue
        found = tuple(views[ins[p]] for p in positions if p < len(ins) and ins[p] in views)
        if found:
            out.append((slots[ins[idx]], found))
    return tuple(out)


def hint_rows(values: list, gathers: tuple[tuple[int, tuple[RowView, ...]], ...]) -> None:
    """Ask for the rows each gather of ``gathers`` will read from the run's bound ``values`` (indices in
    range, sorted, once: as the kernel computes them). A hint only: what is not integer indices is left
    to the kernel, which reports it."""
    for slot, views in gathers:
        ids = values[slot] if slot < len(values) else None
        if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or not ids.size:
            continue
        n = views[0].shape[0]
        norm = ids.reshape(-1).astype(np.int64)
        norm = np.where(norm < 0, norm + n, norm)
        # NOTE: return_inverse keeps numpy.ma unloaded (see resolve/rows.row_capable)
        rows = np.unique(norm[(norm >= 0) & (norm < n)], return_inverse=True)[0]
        for v in views:
            v.hint(rows)
