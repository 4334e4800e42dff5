"""The cold-start timeline picture: one lane per resource worker (an I/O or CPU worker thread, or the
caller's thread; inline tasks run on whichever finished their last dependency), a bar per task coloured
by its kind, and the first-output moment marked. Drawn from a Chrome trace written by ``onnx-prepared bench --trace``.

matplotlib is the optional ``plot`` extra; without it :func:`draw` raises MissingDependencyError.
"""

from __future__ import annotations

import json
import os
from typing import Any

from onnx_prepared.bench.child import task_kind
from onnx_prepared.errors import MissingDependencyError

#: kind -> colour (RGB hex); the test reads these back from the PNG's pixels
COLOURS = {"read": "#1f77b4", "prepack": "#ff7f0e", "persist": "#2ca02c", "publish": "#9467bd",
           "inference": "#d62728", "other": "#7f7f7f"}
_RESOURCE_ORDER = ("io", "cpu")
WIDTH_PX, HEIGHT_PX, DPI = 1600, 900, 100


def lanes_of(doc: dict[str, Any]) -> tuple[list[str], dict[str, list[tuple[float, float, str]]], dict[str, float]]:
    """(lane names in drawing order, lane -> [(start ms, duration ms, kind)], instant name -> ms)."""
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["tid"]}
    bars: dict[str, list[tuple[float, float, str]]] = {}
    marks: dict[str, float] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            lane = str(threads.get(e["tid"], e["tid"])).removeprefix("onnx-prepared-")
            bars.setdefault(lane, []).append((e["ts"] / 1e3, e["dur"] / 1e3, task_kind(e["name"])))
        elif e.get("ph") == "i":
            marks[e["name"]] = e["ts"] / 1e3

    def order(lane: str) -> tuple[int, str]:
        res = lane.split("-", 1)[0]
        return (_RESOURCE_ORDER.index(res) if res in _RESOURCE_ORDER else len(_RESOURCE_ORDER), lane)

    return sorted(bars, key=order), bars, marks


def draw(trace_path: str | os.PathLike, png_path: str | os.PathLike, *, title: str = "") -> dict[str, Any]:
    """Write the PNG (1600x900); returns its layout: lane -> pixel row of the lane's centre, the x pixel
    of first output, the kinds drawn (tests check the picture against it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise MissingDependencyError("the timeline picture needs matplotlib: pip install 'onnx-prepared[plot]'") \
            from None
    with open(trace_path) as f:
        doc = json.load(f)
    order, bars, marks = lanes_of(doc)
    start = marks.get("session start", min((s for b in bars.values() for s, _, _ in b), default=0.0))
    end = max([s + d for b in bars.values() for s, d, _ in b] + [marks.get("first output", start)])
    end = max(end, start + 1e-3)
    fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    kinds: set[str] = set()
    for y, lane in enumerate(order):
        for kind in COLOURS:
            segs = [(s - start, max(d, (end - start) / 500)) for s, d, k in bars[lane] if k == kind]
            if segs:
                ax.broken_barh(segs, (y - 0.4, 0.8), facecolors=COLOURS[kind], edgecolor="white", linewidth=0.4)
                kinds.add(kind)
    ax.set_yticks(range(len(order)), order)
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlim(0, (end - start) * 1.02)
    ax.set_xlabel("ms since session creation started")
    first = marks.get("first output")
    if first is not None:
        ax.axvline(first - start, color="black", linestyle="--", linewidth=1.5)
        ax.text(first - start, -0.45, f"first output {first - start:.0f} ms ", va="top", ha="right", fontsize=10)
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in COLOURS if k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.07), ncol=len(COLOURS), frameon=False)
    ax.set_title(title or "cold start: tasks per resource worker")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.canvas.draw()
    height = fig.canvas.get_width_height()[1]
    rows = {lane: round(height - float(ax.transData.transform((0, y))[1])) for y, lane in enumerate(order)}
    first_px = None if first is None else round(float(ax.transData.transform((first - start, 0))[0]))
    fig.savefig(png_path, dpi=DPI)
    plt.close(fig)
    return {"lanes": rows, "first_output_px": first_px, "kinds": sorted(kinds), "size": fig.canvas.get_width_height()}
