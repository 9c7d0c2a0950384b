"""plotly figures of an experiment's run table: curves, the engine's time split, the chunk
timeline. They need no kernel to view: ``fig.show()``, ``fig.write_html()``, a saved notebook's
output, the HTML report. Colours, dashes and downsampling follow the live panel (``style.py``).

Only plotly features present in plotly 5.24 (Colab's) are used here.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable

import plotly.graph_objects as go

from rapidfire_nb.engine import TIME_KEYS, lower_is_better, runs_by_id, time_field
from rapidfire_nb.report.model import (ReportError, add_point_axes, differing_knobs, knob_text,
                                       ranking_metric, resolve_metric, resolve_split, run_note)
from rapidfire_nb.report.style import drawn_points, run_color, run_dash, trace_point_limit
from rapidfire_nb.tracking.naming import short_name

X_AXES = {"samples": "samples seen", "step": "optimizer step", "time": "wall time (s)"}
MAX_SMOOTHING = 0.99   # the panel's slider goes this far

FADED_OPACITY = 0.35      # deleted and pruned runs, as the panel draws them: present but quiet
TIME_COLORS = {"train": "#1a7f37", "eval": "#0b61a4", "generate": "#8250df", "swap": "#b58900",
               "other": "#8a8a8a"}
_LAYOUT = dict(template="plotly_white", hovermode="closest", height=420,
               margin=dict(l=60, r=20, t=50, b=50), legend=dict(title=dict(text="runs")))


def _esc(text) -> str:
    # plotly renders hover and legend text as a small HTML subset: logged strings stay text
    return html.escape(str(text), quote=False)


def trace_name(run: dict) -> str:
    """The panel's legend name: the run's short name (``3 · lr 1e-3 · r 32``), with "(pruned)" or
    "(deleted)" after it."""
    name = short_name(run["run_id"], run["knobs"])
    if run["status"] == "deleted":
        return f"{name} (deleted)"
    return f"{name} (pruned)" if run["pruned"] else name


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


def smoothed(y: list, weight: float) -> list:
    """TensorBoard's smoothing, as the panel draws it (``js/src/canvaschart.ts``): an exponential
    moving average with its start-up bias removed, over the drawn points; gaps stay gaps."""
    if weight <= 0:
        return list(y)
    out, last, n = [], 0.0, 0
    for v in y:
        if v is None or not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight ** n))
    return out


def _check_curve_options(smoothing, log_y, x) -> None:
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) \
            or not math.isfinite(smoothing) or not 0 <= smoothing <= MAX_SMOOTHING:
        raise ReportError(f"smoothing must be a number from 0 (off) to {MAX_SMOOTHING}, "
                          f"not {smoothing!r}")
    if not isinstance(log_y, bool):
        raise ReportError(f"log_y must be True or False, not {log_y!r}")
    if x not in X_AXES:
        raise ReportError(f"x must be one of {', '.join(repr(k) for k in X_AXES)}, not {x!r}")


def axis_series(table: dict, run: dict, split: str, name: str, x: str) -> dict:
    """A run's series of ``name`` against the chosen x axis: samples seen (the table's series),
    the optimizer step, or seconds since the experiment's first metric (the panel's axes)."""
    s = run["series"][split].get(name, {"x": [], "y": []})
    if x == "samples":
        return s
    if "step" not in s:
        add_point_axes(table)
    t0 = table.get("_t0")
    if t0 is None:
        times = [t for r in table["runs"].values() for sp in ("train", "eval")
                 for ser in r["series"][sp].values() for t in ser.get("time", ()) if t is not None]
        t0 = table["_t0"] = min(times) if times else 0.0
    src = s.get("step", []) if x == "step" else [None if t is None else t - t0 for t in s.get("time", [])]
    xs, ys, last = [], [], -math.inf
    for v, y in zip(src, s["y"]):
        # points without that x, or a clock stepping back, are left out (as in the panel)
        if v is None or v < last:
            continue
        last = v
        xs.append(v)
        ys.append(y)
    return {"x": xs, "y": ys}


def curves_figure(table: dict, metric: str = "loss", split: str | None = None,
                  runs: Iterable[int] | None = None, title: str | None = None,
                  smoothing: float = 0.0, log_y: bool = False, x: str = "samples") -> go.Figure:
    """One curve per run of ``metric``, coloured and downsampled as in the panel; pruned runs end
    in an ✕ whose hover gives the pruner's reason. ``split=None`` takes the split that logs the
    metric (train first). The panel's curve tools: ``smoothing`` (0 to 0.99, TensorBoard's moving
    average; the raw curve stays, faint), ``log_y``, and ``x`` = ``"samples"`` (samples seen),
    ``"step"`` (optimizer step) or ``"time"`` (seconds since the first metric). The hover lists
    every run's value at the pointer's x, by its short name."""
    _check_curve_options(smoothing, log_y, x)
    split = resolve_split(table, metric, split)
    name = resolve_metric(table, metric, split)
    chosen = _select(table, runs)
    knobs = differing_knobs(runs_by_id(table))
    series = {r["run_id"]: axis_series(table, r, split, name, x) for r in chosen}
    with_data = [r for r in chosen if series[r["run_id"]]["x"]]
    limit = trace_point_limit(len(with_data))
    traces = []
    sampled = 0
    x_label = X_AXES[x]
    for run in with_data:
        s = series[run["run_id"]]
        xs, y, thinned = drawn_points(s["x"], s["y"], limit)
        sampled += thinned
        finite = [(xi, yi) for xi, yi in zip(xs, y) if yi is not None and math.isfinite(yi)]
        head = _hover_head(run, knobs)
        group = f"run{run['run_id']}"
        color, opacity = run_color(run["run_id"]), FADED_OPACITY if _faded(run) else 1.0
        shown = smoothed(y, smoothing)
        if smoothing > 0:
            # the raw curve, thin and faint behind the smoothed one (TensorBoard's look)
            traces.append(go.Scatter(
                x=xs, y=y, mode="lines", legendgroup=group, showlegend=False, hoverinfo="skip",
                name=_esc(f"{trace_name(run)} (raw)"), opacity=0.25 * opacity,
                line=dict(color=color, width=1)))
        traces.append(go.Scatter(
            x=xs, y=shown, name=_esc(trace_name(run)), legendgroup=group,
            mode="lines+markers" if len(finite) == 1 else "lines",
            line=dict(color=color, dash=run_dash(run["run_id"]), width=1.5),
            opacity=opacity, customdata=y,
            hovertemplate=(f"{_esc(trace_name(run))} %{{y:.4g}}"
                           + (" (raw %{customdata:.4g})" if smoothing > 0 else "") + "<extra></extra>")))
        if run["pruned"] and finite:
            reason = run_note(run)
            traces.append(go.Scatter(
                x=[finite[-1][0]], y=[finite[-1][1]], mode="markers", legendgroup=group,
                showlegend=False, name=_esc(f"{trace_name(run)}: {reason}"),
                marker=dict(symbol="x", size=10, color=color, line=dict(width=1, color=color)),
                hovertemplate=f"{head}<br>pruned here: {_esc(reason)}<extra></extra>"))
    fig = go.Figure(data=traces)
    what = "eval" if split == "eval" else "train"
    label = title if title is not None else f"{name} ({what})"
    if smoothing > 0:
        label += f" · smoothed {smoothing:g}"
    if sampled:
        label += f" · {sampled} of {len(with_data)} curves thinned to {limit} points (LTTB)"
    # "x unified": the hover lists every run's value at the pointer's x, as the panel's does
    fig.update_layout(title=dict(text=_esc(label)), xaxis=dict(title=dict(text=x_label)),
                      yaxis=dict(title=dict(text=_esc(name)), type="log" if log_y else "linear"),
                      **{**_LAYOUT, "hovermode": "x unified"})
    if not with_data:
        fig.add_annotation(text=f"no run has logged {_esc(name)} ({what}) yet", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def curves_with_x_menu(table: dict, metric: str = "loss", split: str | None = None) -> go.Figure:
    """``curves_figure`` against samples seen, with buttons that redraw it against the optimizer
    step or wall time (each axis's own points: thinning and the points an axis lacks differ), so
    the report offers the panel's three x axes without a kernel. Without the buttons when the
    axes do not draw the same curves (a run with samples but no times)."""
    figs = {x: curves_figure(table, metric, split, x=x) for x in X_AXES}
    base = figs["samples"]
    if not base.data or len({len(f.data) for f in figs.values()}) != 1:
        return base
    buttons = [dict(label=label, method="update",
                    args=[{"x": [list(t.x) for t in figs[x].data], "y": [list(t.y) for t in figs[x].data]},
                          {"xaxis.title.text": label}])
               for x, label in X_AXES.items()]
    base.update_layout(updatemenus=[dict(
        type="buttons", direction="right", buttons=buttons, showactive=True, active=0,
        x=1.0, xanchor="right", y=1.02, yanchor="bottom", pad=dict(r=0, t=0),
        font=dict(size=11))])
    return base


KINDS = ("curves", "knobs", "parcoords", "resources")


def plot_figure(table: dict, metric: str = "loss", split: str | None = None,
                runs: Iterable[int] | None = None, kind: str = "curves", **options) -> go.Figure:
    """``Experiment.plot``. ``kind="curves"`` (``curves_figure``: ``smoothing``, ``log_y``,
    ``x``); ``"knobs"`` / ``"parcoords"`` (``knobs_figure``: ``value="best"|"latest"``; the
    metric defaults to the leaderboard's, eval_loss, when left at ``"loss"``); ``"resources"``
    (``resources_figure``)."""
    if kind == "curves":
        return curves_figure(table, metric, split, runs, **options)
    if kind in ("knobs", "parcoords"):
        if runs is not None:
            raise ReportError("runs= is for curves; the knob views show every run")
        chosen = None if (metric == "loss" and split is None) else metric
        return knobs_figure(table, chosen, kind="scatter" if kind == "knobs" else "parcoords",
                            split=split, **options)
    if kind == "resources":
        return resources_figure(table)
    raise ReportError(f"kind must be one of {', '.join(repr(k) for k in KINDS)}, not {kind!r}")


def time_split_figure(table: dict) -> go.Figure:
    """Where each run's engine time went (train, eval, generate, swap, other), stacked per run."""
    runs = [r for r in runs_by_id(table) if any(r["time"][k] for k in TIME_KEYS)]
    labels = [f"run {r['run_id']}" for r in runs]
    traces = [go.Bar(orientation="h", y=labels, x=[r["time"][k] for r in runs], name=k,
                     marker=dict(color=TIME_COLORS[k]),
                     hovertemplate=f"%{{y}} · {k} %{{x:.3f}} s<extra></extra>")
              for k in TIME_KEYS]
    total = sum(table["time"].values())
    parts = ", ".join(f"{k} {table['time'][k]:.1f} s" for k in TIME_KEYS)
    share = (f" · {100 * (table['time']['swap'] + table['time']['other']) / total:.1f} % outside "
             "train, eval and generation" if total > 0 else "")
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
        times = ", ".join(f"{k} {r[time_field(k)]:.2f} s" for k in TIME_KEYS
                          if isinstance(r.get(time_field(k)), (int, float)))
        d["text"].append(_esc(" ".join(p for p in parts if p) + (f" · {times}" if times else "")))
    traces = []
    for run_id in sorted(lanes):
        d = lanes[run_id]
        traces.append(go.Bar(
            orientation="h", y=d["y"], x=d["x"], base=d["base"], name=f"run {run_id}",
            text=d["text"], textposition="none", customdata=d["base"],
            marker=dict(color=run_color(run_id), line=dict(width=0.5, color="#ffffff")),
            hovertemplate=(f"run {run_id} · %{{text}}<br>starts at %{{customdata:.1f}} s, "
                           "lasts %{x:.2f} s<extra></extra>")))
    fig = go.Figure(data=traces)
    fig.update_layout(barmode="overlay", title=dict(text=f"chunk timeline · {len(rows)} chunks"),
                      xaxis=dict(title=dict(text="seconds since the first chunk")),
                      **{**_LAYOUT, "height": max(220, 120 + 40 * len({y for d in lanes.values() for y in d["y"]}))})
    if not rows:
        fig.add_annotation(text="no chunk trained yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
    return fig


# -- knobs -> metric -----------------------------------------------------------------------------

MARKS = {"run": ("circle", None), "pruned": ("x", None), "stopped": ("circle-open", None),
         "failed": ("square-open", "#cf222e")}


def _mark(run: dict) -> str:
    if run["status"] == "failed":
        return "failed"
    if run["pruned"]:
        return "pruned"
    return "stopped" if run["status"] == "stopped" else "run"


def varying_knobs(runs: list[dict]) -> list[str]:
    """The knob keys whose logged values differ between ``runs`` (the panel's ``knobColumns``:
    a knob whose values never vary is left out), sorted."""
    keys = sorted({k for r in runs for k in r["knobs"]})
    absent = object()
    out = []
    for k in keys:
        vals = {json.dumps(r["knobs"][k], sort_keys=True, default=str) if k in r["knobs"] else absent
                for r in runs}
        if len(vals) > 1:
            out.append(k)
    return out


def _knob_column(runs: list[dict], key: str) -> list[str]:
    return [json.dumps(r["knobs"][key], sort_keys=True, default=str)
            if r["knobs"].get(key) is not None else "\u0000" for r in runs]


def _together(a: list[str], b: list[str]) -> bool:
    """One value of each knob with one value of the other, run for run, both ways."""
    ab: dict[str, str] = {}
    ba: dict[str, str] = {}
    for x, y in zip(a, b):
        if ab.setdefault(x, y) != y or ba.setdefault(y, x) != x:
            return False
    return True


def knob_label(v) -> str:
    """A knob value as an axis reads it: a list (target_modules) as the table writes it."""
    if isinstance(v, (list, tuple)):
        return ", ".join(x if isinstance(x, str) else json.dumps(x, default=str) for x in v)
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _numeric(runs: list[dict], key: str) -> bool:
    vals = [r["knobs"].get(key) for r in runs if r["knobs"].get(key) is not None]
    return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def linked_knobs(runs: list[dict], keys: list[str]) -> list[tuple[str, list[str]]]:
    """The panel's rule (``linkAxes`` in js/src/knobview.ts): knobs whose values go together run
    for run (the two LoRA configs of a grid set r, lora_alpha and target_modules at once) make one
    plot, the same points over other labels. Each group as (the knob its axis shows, the others):
    its number knob with the shortest name (r before lora_alpha), else its shortest-labelled one."""
    cols = {k: _knob_column(runs, k) for k in keys}

    def rank(k: str):
        if _numeric(runs, k):
            return (0, len(k.split(".")[-1]), k)
        labels = [knob_label(r["knobs"][k]) for r in runs if r["knobs"].get(k) is not None]
        return (1, max(map(len, labels), default=0), k)

    taken: set[str] = set()
    out = []
    for k in keys:
        if k in taken:
            continue
        group = [b for b in keys if b not in taken and _together(cols[k], cols[b])]
        taken.update(group)
        lead = min(group, key=rank)
        out.append((lead, [b for b in group if b != lead]))
    return out


def wrap_label(text: str, chars: int, max_lines: int = 3) -> str:
    """``text`` in lines of at most ``chars`` characters (broken at spaces, after commas), joined
    with ``<br>`` for plotly; past ``max_lines`` the last line ends in "…"."""
    chars = max(4, chars)
    lines: list[str] = []
    line = ""
    for word in text.split():
        if not line or len(line) + 1 + len(word) <= chars:
            line = f"{line} {word}" if line else word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    lines = [x if len(x) <= chars else x[:chars - 1] + "…" for x in lines]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:chars - 1].rstrip(", ") + "…"
    return "<br>".join(_esc(x) for x in lines)


# The knob plots are laid out for a report read at 1280 px (about 1180 px of figure): at most
# KNOB_COLUMNS plots a row, and tick labels wrapped to the width each one gets.
KNOB_COLUMNS = 4
_KNOB_FIGURE_PX = 1100
_CHAR_PX = 7


def knobs_figure(table: dict, metric: str | None = None, value: str = "best",
                 kind: str = "scatter", split: str | None = None) -> go.Figure:
    """Every run's knob values against ``metric`` (default: the leaderboard's, eval_loss): its
    ``value="best"`` or ``"latest"`` value. ``kind="scatter"``: one small scatter per knob that
    varies; ``"parcoords"``: plotly's parallel coordinates, a line per run through its knobs to
    the metric. Pruned runs are crosses, stopped ones hollow, failed ones red squares (a
    ``status`` axis in parallel coordinates); runs with no finite value are named in the title."""
    from plotly.subplots import make_subplots

    if value not in ("best", "latest"):
        raise ReportError(f"value must be 'best' or 'latest', not {value!r}")
    if kind not in ("scatter", "parcoords"):
        raise ReportError(f"kind must be 'scatter' or 'parcoords' here, not {kind!r}")
    if metric is None:
        metric = ranking_metric(table) or "eval_loss"
    split = resolve_split(table, metric, split)
    name = resolve_metric(table, metric, split)
    runs = [r for r in runs_by_id(table) if r["status"] != "deleted"]
    keys = varying_knobs(runs)
    with_value, missing = [], []
    for r in runs:
        v = r[value].get(name)
        (with_value if isinstance(v, (int, float)) and math.isfinite(v) else missing).append((r, v))
    title = f"knobs → {name} ({value})"
    if missing:
        ids = ", ".join(str(r["run_id"]) for r, _ in missing)
        title += f" · no value for run{'s' if len(missing) > 1 else ''} {ids}"
    if not keys:
        fig = go.Figure()
        fig.add_annotation(text="no knob varies between the runs", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.5)
        fig.update_layout(title=dict(text=_esc(title)), **_LAYOUT)
        return fig
    short = {k: k.split(".")[-1] for k in keys}
    if kind == "parcoords":
        dims = []
        for k in keys:
            vals = [r["knobs"].get(k) for r, _ in with_value]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals) and vals:
                positive = all(v > 0 for v in vals)
                log = positive and max(vals) / min(vals) >= 20
                if log:
                    exps = range(math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals))) + 1)
                    dims.append(dict(label=f"{short[k]} (log)", values=[math.log10(v) for v in vals],
                                     tickvals=list(exps), ticktext=[f"1e{e}" for e in exps]))
                else:
                    dims.append(dict(label=short[k], values=vals))
            else:
                cats = sorted({json.dumps(v, default=str) if not isinstance(v, str) else v for v in vals})
                codes = [cats.index(json.dumps(v, default=str) if not isinstance(v, str) else v) for v in vals]
                dims.append(dict(label=short[k], values=codes, tickvals=list(range(len(cats))),
                                 ticktext=cats))
        marks = [_mark(r) for r, _ in with_value]
        order = list(MARKS)
        dims.append(dict(label="status", values=[order.index(m) for m in marks],
                         tickvals=list(range(len(order))), ticktext=order))
        dims.append(dict(label=name, values=[v for _, v in with_value]))
        low = lower_is_better(name)
        fig = go.Figure(go.Parcoords(
            line=dict(color=[v for _, v in with_value], colorscale="Viridis", reversescale=low,
                      showscale=True, colorbar=dict(title=dict(text=_esc(name)))),
            dimensions=dims))
        fig.update_layout(title=dict(text=_esc(title)), **{**_LAYOUT, "margin": dict(l=60, r=60, t=80, b=40)})
        return fig
    groups = linked_knobs(runs, keys)
    cols = min(KNOB_COLUMNS, len(groups))
    rows = -(-len(groups) // cols)
    plot_px = _KNOB_FIGURE_PX / cols
    titles = [wrap_label(" · ".join(short[k] for k in (lead, *linked)), int(plot_px / _CHAR_PX), 2)
              for lead, linked in groups]
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, horizontal_spacing=0.06,
                        vertical_spacing=min(0.3, 0.9 / rows), subplot_titles=titles)
    label_lines = 1
    for i, (k, linked) in enumerate(groups):
        row, col = i // cols + 1, i % cols + 1
        xs, ys, colors, symbols, lines, texts = [], [], [], [], [], []
        for r, v in with_value:
            kv = r["knobs"].get(k)
            mark = _mark(r)
            symbol, line = MARKS[mark]
            xs.append(kv if isinstance(kv, (int, float, str)) and not isinstance(kv, bool) else knob_label(kv))
            ys.append(v)
            colors.append(run_color(r["run_id"]))
            symbols.append(symbol)
            lines.append(line or run_color(r["run_id"]))
            also = "".join(f"<br>{_esc(short[b])} {_esc(knob_label(r['knobs'].get(b)))}" for b in linked)
            texts.append(_esc(f"{trace_name(r)} · {mark}" if mark != "run" else trace_name(r)) + also)
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", showlegend=False, text=texts, name=_esc(short[k]),
            marker=dict(color=colors, symbol=symbols, size=10, line=dict(width=2, color=lines)),
            hovertemplate=f"%{{text}}<br>{_esc(short[k])} %{{x}}<br>{_esc(name)} %{{y:.4g}}<extra></extra>"),
            row=row, col=col)
        nums = [x for x in xs if isinstance(x, (int, float))]
        if len(nums) == len(xs) and nums and min(nums) > 0 and max(nums) / min(nums) >= 20:
            fig.update_xaxes(type="log", nticks=4, row=row, col=col)
        elif len(nums) != len(xs):
            # categories: every label level, each wrapped to its share of the plot's width
            cats = sorted({str(x) for x in xs})
            wrapped = [wrap_label(c, int(plot_px / max(1, len(cats)) / _CHAR_PX) - 1) for c in cats]
            label_lines = max(label_lines, *(w.count("<br>") + 1 for w in wrapped))
            fig.update_xaxes(type="category", tickmode="array", tickvals=cats, ticktext=wrapped,
                             tickangle=0, categoryorder="array", categoryarray=cats, row=row, col=col)
        else:
            fig.update_xaxes(nticks=4, row=row, col=col)
        if col == 1:
            fig.update_yaxes(title=dict(text=_esc(name)), row=row, col=col)
    fig.update_xaxes(automargin=True)
    fig.update_layout(title=dict(text=_esc(title) + "<br><sup>✕ pruned · ○ stopped · □ failed</sup>"),
                      **{**_LAYOUT, "height": 380 + (rows - 1) * 300 + 14 * (label_lines - 1) * rows,
                         "margin": dict(l=60, r=20, t=90, b=50 + 14 * (label_lines - 1))})
    return fig


# -- resources --------------------------------------------------------------------------------

def resources_figure(table: dict) -> go.Figure:
    """Per run and chunk: the peak memory (MB; CUDA max allocated, or the process's resident set
    on a CPU) and the tokens trained per second, from the log's chunk_done events."""
    from plotly.subplots import make_subplots

    # off CUDA the engine reads the process's resident set: one figure for all runs, said as such
    own = any(str(r.get("device") or "").startswith("cuda") for r in table["timeline"])
    memory = "peak memory (MB)" if own else "process peak memory (MB; on a CPU shared by every run)"
    fig = make_subplots(rows=1, cols=2, subplot_titles=[memory, "tokens / s"])
    by_run: dict[int, list[dict]] = {}
    for row in table["timeline"]:
        if isinstance(row.get("run_id"), int):
            by_run.setdefault(row["run_id"], []).append(row)
    names = {r["run_id"]: trace_name(r) for r in runs_by_id(table)}
    shown = 0
    for rid in sorted(by_run):
        rows = by_run[rid]
        for col, key in ((1, "peak_mem_mb"), (2, "tokens_per_s")):
            pts = [(i + 1, r.get(key)) for i, r in enumerate(rows)
                   if isinstance(r.get(key), (int, float)) and math.isfinite(r.get(key))]
            if not pts:
                continue
            shown += 1
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                name=_esc(names.get(rid, f"run {rid}")), legendgroup=f"run{rid}", showlegend=col == 1,
                line=dict(color=run_color(rid), dash=run_dash(rid), width=1.5),
                hovertemplate=f"{_esc(names.get(rid, f'run {rid}'))}<br>chunk %{{x}} · %{{y:.4g}}<extra></extra>"),
                row=1, col=col)
    fig.update_xaxes(title=dict(text="chunk trained (run's own count)"))
    fig.update_layout(title=dict(text="resources per chunk"), **{**_LAYOUT, "height": 360})
    if not shown:
        fig.add_annotation(text="no chunk with resource figures (a log from an older version, or none trained)",
                           showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig
