"""plotly figures of an experiment's run table: curves, the engine's time split, the chunk
timeline. They need no kernel to view: ``fig.show()``, ``fig.write_html()``, a saved notebook's
output, the HTML report. Colours, dashes and downsampling follow the live panel (``style.py``).

Only plotly features present in plotly 5.24 (Colab's) are used here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

import plotly.graph_objects as go

from rapidfire_nb.engine import TIME_KEYS, runs_by_id
from rapidfire_nb.report.model import (ReportError, differing_knobs, knob_text, resolve_metric,
                                       resolve_split, run_note)
from rapidfire_nb.report.style import drawn_points, run_color, run_dash, trace_point_limit

FADED_OPACITY = 0.35      # deleted and pruned runs, as the panel draws them: present but quiet
TIME_COLORS = {"train": "#1a7f37", "eval": "#0b61a4", "swap": "#b58900", "other": "#8a8a8a"}
_LAYOUT = dict(template="plotly_white", hovermode="closest", height=420,
               margin=dict(l=60, r=20, t=50, b=50), legend=dict(title=dict(text="runs")))


def _esc(text) -> str:
    # plotly renders hover and legend text as a small HTML subset: logged strings stay text
    return html.escape(str(text), quote=False)


def trace_name(run: dict) -> str:
    """The panel's legend name: "run 3", "run 3 (pruned)", "run 3 (deleted)"."""
    if run["status"] == "deleted":
        return f"run {run['run_id']} (deleted)"
    return f"run {run['run_id']} (pruned)" if run["pruned"] else f"run {run['run_id']}"


def _faded(run: dict) -> bool:
    return run["status"] == "deleted" or run["pruned"]


def _select(table: dict, runs: Iterable[int] | None) -> list[dict]:
    every = runs_by_id(table)
    if runs is None:
        return every
    if isinstance(runs, (int, str)) or not isinstance(runs, Iterable):
        raise ReportError(f"runs must be a list of run ids such as [1, 3], not {runs!r}")
    wanted = list(runs)
    if not wanted:
        raise ReportError("runs is empty: give run ids such as [1, 3], or None for every run")
    known = {r["run_id"] for r in every}
    bad = [r for r in wanted if isinstance(r, bool) or not isinstance(r, int)]
    if bad:
        raise ReportError(f"runs must be run ids (integers), got {bad[0]!r}")
    missing = [r for r in wanted if r not in known]
    if missing:
        raise ReportError(f"no run {missing[0]} in this experiment (runs: "
                          f"{', '.join(str(r) for r in sorted(known)) or 'none yet'})")
    return [r for r in every if r["run_id"] in set(wanted)]


def _hover_head(run: dict, knobs: dict[str, str]) -> str:
    lines = [f"<b>{_esc(trace_name(run))}</b> · {_esc(run['status'])}"]
    pairs = knob_text(run, knobs)
    if pairs:
        lines.append(_esc(", ".join(f"{k}={v}" for k, v in pairs)))
    return "<br>".join(lines)


def curves_figure(table: dict, metric: str = "loss", split: str | None = None,
                  runs: Iterable[int] | None = None, title: str | None = None) -> go.Figure:
    """One curve per run of ``metric`` against samples seen, coloured and downsampled as in
    the panel; pruned runs end in an ✕ whose hover gives the pruner's reason. ``split=None``
    takes the split that logs the metric (train first)."""
    split = resolve_split(table, metric, split)
    name = resolve_metric(table, metric, split)
    chosen = _select(table, runs)
    knobs = differing_knobs(runs_by_id(table))
    with_data = [r for r in chosen if r["series"][split].get(name, {}).get("x")]
    limit = trace_point_limit(len(with_data))
    traces = []
    sampled = 0
    for run in with_data:
        s = run["series"][split][name]
        x, y, thinned = drawn_points(s["x"], s["y"], limit)
        sampled += thinned
        finite = [(xi, yi) for xi, yi in zip(x, y) if yi is not None and math.isfinite(yi)]
        head = _hover_head(run, knobs)
        group = f"run{run['run_id']}"
        traces.append(go.Scatter(
            x=x, y=y, name=_esc(trace_name(run)), legendgroup=group,
            mode="lines+markers" if len(finite) == 1 else "lines",
            line=dict(color=run_color(run["run_id"]), dash=run_dash(run["run_id"]), width=1.5),
            opacity=FADED_OPACITY if _faded(run) else 1.0,
            hovertemplate=f"{head}<br>samples seen %{{x}}<br>{_esc(name)} %{{y:.4g}}<extra></extra>"))
        if run["pruned"] and finite:
            reason = run_note(run)
            traces.append(go.Scatter(
                x=[finite[-1][0]], y=[finite[-1][1]], mode="markers", legendgroup=group,
                showlegend=False, name=_esc(f"{trace_name(run)}: {reason}"),
                marker=dict(symbol="x", size=10, color=run_color(run["run_id"]),
                            line=dict(width=1, color=run_color(run["run_id"]))),
                hovertemplate=f"{head}<br>pruned here: {_esc(reason)}<extra></extra>"))
    fig = go.Figure(data=traces)
    what = "eval" if split == "eval" else "train"
    label = title if title is not None else f"{name} ({what})"
    if sampled:
        label += f" · {sampled} of {len(with_data)} curves thinned to {limit} points (LTTB)"
    fig.update_layout(title=dict(text=_esc(label)), xaxis=dict(title=dict(text="samples seen")),
                      yaxis=dict(title=dict(text=_esc(name))), **_LAYOUT)
    if not with_data:
        fig.add_annotation(text=f"no run has logged {_esc(name)} ({what}) yet", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def time_split_figure(table: dict) -> go.Figure:
    """Where each run's engine time went (train, eval, swap, other), stacked per run."""
    runs = [r for r in runs_by_id(table) if any(r["time"][k] for k in TIME_KEYS)]
    labels = [f"run {r['run_id']}" for r in runs]
    traces = [go.Bar(orientation="h", y=labels, x=[r["time"][k] for r in runs], name=k,
                     marker=dict(color=TIME_COLORS[k]),
                     hovertemplate=f"%{{y}} · {k} %{{x:.3f}} s<extra></extra>")
              for k in TIME_KEYS]
    total = sum(table["time"].values())
    parts = ", ".join(f"{k} {table['time'][k]:.1f} s" for k in TIME_KEYS)
    share = (f" · {100 * (table['time']['swap'] + table['time']['other']) / total:.1f} % outside "
             "train and eval" if total > 0 else "")
    fig = go.Figure(data=traces)
    fig.update_layout(barmode="stack", title=dict(text=f"engine time: {parts}{share}"),
                      xaxis=dict(title=dict(text="seconds")),
                      yaxis=dict(autorange="reversed"),
                      **{**_LAYOUT, "height": max(220, 60 + 18 * len(runs)),
                         "legend": dict(title=dict(text="time"))})
    return fig


def timeline_figure(table: dict) -> go.Figure:
    """Every trained chunk as a bar on its device (or Ray worker), in the run's colour."""
    rows = [r for r in table["timeline"]
            if isinstance(r.get("run_id"), int) and isinstance(r.get("start"), (int, float))
            and isinstance(r.get("end"), (int, float))]
    t0 = min((r["start"] for r in rows), default=0.0)
    lanes: dict[int, dict[str, list]] = {}
    for r in rows:
        lane = f"{r['worker']}:{r['device']}" if r.get("worker") else str(r.get("device") or "device")
        d = lanes.setdefault(r["run_id"], {"y": [], "x": [], "base": [], "text": []})
        d["y"].append(lane)
        d["base"].append(r["start"] - t0)
        d["x"].append(max(0.0, r["end"] - r["start"]))
        parts = [f"epoch {int(r['epoch']) + 1}" if isinstance(r.get("epoch"), int) else "",
                 f"chunk {int(r['chunk']) + 1}" if isinstance(r.get("chunk"), int) else ""]
        times = ", ".join(f"{k} {r[f'{k}_s']:.2f} s" for k in TIME_KEYS
                          if isinstance(r.get(f"{k}_s"), (int, float)))
        d["text"].append(_esc(" ".join(p for p in parts if p) + (f" · {times}" if times else "")))
    traces = []
    for run_id in sorted(lanes):
        d = lanes[run_id]
        traces.append(go.Bar(
            orientation="h", y=d["y"], x=d["x"], base=d["base"], name=f"run {run_id}",
            text=d["text"], textposition="none", customdata=d["base"],
            marker=dict(color=run_color(run_id), line=dict(width=0.5, color="#ffffff")),
            hovertemplate=f"run {run_id} · %{{text}}<br>starts at %{{customdata:.1f}} s, lasts %{{x:.2f}} s<extra></extra>"))
    fig = go.Figure(data=traces)
    fig.update_layout(barmode="overlay", title=dict(text=f"chunk timeline · {len(rows)} chunks"),
                      xaxis=dict(title=dict(text="seconds since the first chunk")),
                      **{**_LAYOUT, "height": max(220, 120 + 40 * len({y for d in lanes.values() for y in d["y"]}))})
    if not rows:
        fig.add_annotation(text="no chunk trained yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
    return fig
