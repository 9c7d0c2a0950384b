"""Run colours, dashes and downsampling: the live panel's rules, in Python.

The panel (``js/src/palette.ts``, ``js/src/chartplan.ts``) and these figures must draw run 7 in
the same colour and dash, and thin a long curve the same way, so a figure and the panel read with
one key. The numbers live in ``palette.json`` beside this file; ``js/test/palette.test.ts``
checks that those hold the same ones and that its LTTB picks the same points as ``lttb`` here on shared fixtures
(``tests/fixtures/report/downsample.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

_RULES = json.loads(Path(__file__).with_name("palette.json").read_text(encoding="utf-8"))

PALETTE: tuple[str, ...] = tuple(_RULES["palette"])
DASHES: tuple[str, ...] = tuple(_RULES["dashes"])
POINT_BUDGET: int = _RULES["point_budget"]
MIN_TRACE_POINTS: int = _RULES["min_trace_points"]
MAX_TRACE_POINTS: int = _RULES["max_trace_points"]


def run_color(run_id: int) -> str:
    """One colour per run id; ids past the palette's length wrap around (with another dash)."""
    return PALETTE[(run_id - 1) % len(PALETTE)]


def run_dash(run_id: int) -> str:
    """The plotly dash name telling apart runs that share a colour (run 1 and run 25)."""
    return DASHES[(max(0, run_id - 1) // len(PALETTE)) % len(DASHES)]


def trace_point_limit(traces: int) -> int:
    """Points each curve of a chart keeps: an equal share of the chart's budget, clamped."""
    return max(MIN_TRACE_POINTS, min(MAX_TRACE_POINTS, POINT_BUDGET // max(1, traces)))


def _finite(v) -> bool:
    return v is not None and not isinstance(v, bool) and math.isfinite(v)


def lttb(x: Sequence[float], y: Sequence[float | None], threshold: int) -> tuple[list, list]:
    """Largest-Triangle-Three-Buckets, step for step as the panel's ``lttb``: ``threshold`` points,
    first and last kept, missing y values dropped. x must be ascending."""
    xs = [x[i] for i in range(len(x)) if _finite(y[i])]
    ys = [y[i] for i in range(len(x)) if _finite(y[i])]
    n = len(xs)
    if threshold >= n or threshold < 3:
        return xs, ys
    out_x, out_y = [xs[0]], [ys[0]]
    every = (n - 2) / (threshold - 2)
    a = 0
    for i in range(threshold - 2):
        start = math.floor(i * every) + 1
        end = min(math.floor((i + 1) * every) + 1, n - 1)
        n_start, n_end = end, min(math.floor((i + 2) * every) + 1, n)
        avg_x = avg_y = 0.0
        for j in range(n_start, n_end):
            avg_x += xs[j]
            avg_y += ys[j]
        count = max(1, n_end - n_start)
        avg_x /= count
        avg_y /= count
        best, best_area = start, -1.0
        for j in range(start, end):
            area = abs((xs[a] - avg_x) * (ys[j] - ys[a]) - (xs[a] - xs[j]) * (avg_y - ys[a]))
            if area > best_area:
                best_area, best = area, j
        out_x.append(xs[best])
        out_y.append(ys[best])
        a = best
    out_x.append(xs[-1])
    out_y.append(ys[-1])
    return out_x, out_y


def drawn_points(x: Sequence[float], y: Sequence[float | None], max_points: int) -> tuple[list, list, bool]:
    """What a chart draws of a whole series (the panel's ``drawnPoints`` with no zoom): every point
    (gaps kept) up to ``max_points``, LTTB above. Returns (x, y, downsampled)."""
    if len(x) <= max_points:
        return list(x), list(y), False
    dx, dy = lttb(x, y, max_points)
    return dx, dy, True
