"""The self-contained HTML report and the static leaderboard a saved notebook shows.

``write_report`` writes one file: plotly.js inlined from the installed plotly package, the
figures as JSON, the tables as HTML. It loads nothing from the network and needs no server.
Every string from the experiment (names, knob values, reasons, tracebacks) is escaped.
"""

from __future__ import annotations

import html
import math
import re
import time
from pathlib import Path

from rapidfire_nb._version import __version__
from rapidfire_nb.engine import lower_is_better, runs_by_id
from rapidfire_nb.report.model import (ReportError, cut_text, differing_knobs, knob_text,
                                       leaderboard, lineage, ranking_metric, run_note)
from rapidfire_nb.report.style import run_color

_STATUS_ORDER = ("running", "pending", "completed", "stopped", "failed", "deleted")


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _num(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _text(cell_html: str) -> str:
    """A cell's text, for its title: the markup gone, the entities read back."""
    return html.unescape(re.sub(r"<[^>]*>", "", cell_html)).strip()


def status_counts(table: dict) -> str:
    counts: dict[str, int] = {}
    for run in runs_by_id(table):
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    order = sorted(counts, key=lambda s: _STATUS_ORDER.index(s) if s in _STATUS_ORDER else 99)
    return ", ".join(f"{counts[s]} {s}" for s in order) or "no runs"


def log_state(table: dict) -> str:
    """What the log says about the experiment's end, in words."""
    if table["ended"]:
        return "ended (the log closes with the experiment's end)"
    live = [r["run_id"] for r in runs_by_id(table) if r["status"] == "running"]
    tail = (f"; run{'s' if len(live) > 1 else ''} {', '.join(map(str, live))} "
            f"{'were' if len(live) > 1 else 'was'} training at its last event" if live else "")
    if not any(r["status"] in ("pending", "running") for r in runs_by_id(table)):
        # every run finished or stopped: a live kernel that has not called end() reads this way
        return ("not ended: no run was training or waiting at the last event; end() was not "
                "called (the experiment may still be open in a notebook, or its process stopped)")
    return ("not ended: the experiment is still training, or its process stopped without "
            f"end() (a crash, a kill, a closed notebook){tail}")


def leaderboard_html(table: dict, *, compact: bool = False) -> str:
    """The run table, best first: rank, run, status, the ranking metric, the knobs that differ,
    progress, lineage and the reason a run stopped. Plain HTML (inline styles only)."""
    runs = leaderboard(table)
    metric = ranking_metric(table)
    knobs = differing_knobs(runs_by_id(table))
    head = ["#", "run", "status"]
    if metric is not None:
        word = "lowest" if lower_is_better(metric) else "highest"
        head += [f"best {metric} ({word} first)", f"last {metric}"]
    head += list(knobs.values())
    head += ["samples seen", "steps", "chunks"]
    if not compact or any(r["parent_run_id"] is not None for r in runs):
        head.append("lineage")
    show_lineage = "lineage" in head
    head.append("note")
    # a header wraps between its words ("best eval_loss" over "(lowest first)"), never inside one
    cell = 'style="padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;white-space:normal"'
    # A cell never breaks inside a number or a name ("0.64" over "21" misreads as two values): a
    # long value (target_modules, a failure's reason) is cut with an ellipsis, whole in the cell's
    # title, and a table still wider than the page scrolls in its own box: the page never
    # outgrows a 1280 px window.
    clip = ('style="padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;'
            'white-space:nowrap;max-width:12em;overflow:hidden;text-overflow:ellipsis"')
    # the note is prose the user wrote: it wraps in its own column instead of being cut, so the
    # last column stays readable in a 1280 px window
    wrap = ('style="padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;'
            'white-space:normal;min-width:8em;max-width:20em;overflow-wrap:break-word"')
    out = ['<div style="overflow-x:auto;max-width:100%"><table style="border-collapse:collapse;font-size:13px">',
           "<thead><tr>" + "".join(f"<th {cell}>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for rank, run in enumerate(runs, start=1):
        color = run_color(run["run_id"])
        steps = (f"{run['completed_steps']}/{run['total_steps']}" if run["total_steps"]
                 else str(run["completed_steps"]))
        row = [str(rank) if metric is not None and run["best"].get(metric) is not None else "",
               f'<span style="color:{color}">&#9632;</span> {run["run_id"]}', _e(run["status"])]
        if metric is not None:
            row += [_num(run["best"].get(metric)), _num(run["latest"].get(metric))]
        row += [_e(v) for _, v in knob_text(run, knobs)]
        row += [str(run["samples_seen"]), steps, str(run["chunks_done"])]
        if show_lineage:
            row.append(_e(lineage(table, run)))
        row.append(_e(run_note(run)))
        out.append("<tr>" + "".join(f'<td {wrap if i == len(row) - 1 else clip} title="{_e(_text(c))}">{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def fallback_html(table: dict) -> str:
    """What a saved notebook shows where the live panel cannot render (GitHub, nbviewer, a
    notebook reopened without its kernel): the runs when the cell ran, and how to see more."""
    name = table["experiment"] or "experiment"
    return (
        '<div style="font-family:sans-serif">'
        f"<div><b>rapidfire_nb</b> · {_e(name)}: {_e(status_counts(table))} "
        f"when this output was made (event {table['last_seq']}; later progress is not in it)</div>"
        + leaderboard_html(table, compact=True)
        + '<div style="color:#666;font-size:12px">This is a static copy. The live panel (curves '
        "and Stop/Resume/Clone buttons) needs a running kernel with rapidfire_nb; "
        "<code>exp.plot()</code> draws curves anywhere plotly renders, and "
        "<code>rapidfire report &lt;experiment folder&gt; -o report.html</code> writes a "
        "self-contained report.</div></div>")


def _figure_div(fig, div_id: str) -> str:
    import plotly.io as pio

    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id,
                       default_width="100%", config={"displaylogo": False, "responsive": True})


# One figure per metric name costs ~17 ms and ~10 KB of report each: a log of thousands of names
# (crafted, or a trainer that logs a name per token) made a report of minutes and tens of MB.
# The report draws the first names logged (the losses come first) and lists the rest.
MAX_CURVES_PER_SPLIT = 24
_LISTED = 50


def _left_out_note(names: list, split: str) -> str:
    rest = names[MAX_CURVES_PER_SPLIT:]
    if not rest:
        return ""
    shown = ", ".join(_e(n) for n in rest[:_LISTED]) + (", …" if len(rest) > _LISTED else "")
    return (f'<p class="meta">{len(rest)} more {split} metric{"s" if len(rest) > 1 else ""} '
            f"logged but not drawn (a report draws the first {MAX_CURVES_PER_SPLIT} of each split, in "
            f"the order they were first logged): {shown}. <code>exp.plot(name)</code> draws any "
            "of them.</p>")


MAX_GENERATION_POINTS = 24   # earlier answer tables kept in the report, newest first


def _shown_text(text: str) -> str:
    """An answer as the page shows it: control characters (other than line breaks and tabs) as
    U+FFFD, an empty answer said in words rather than left as a blank cell, a long one cut."""
    if not text.strip():
        return ('<i style="color:#888" title="the run generated no text (its first new token ended '
                'the answer)">(empty answer)</i>')
    return _e("".join(c if c in "\n\t" or ord(c) >= 32 and ord(c) != 127 else "\ufffd" for c in cut_text(text)))


def generations_html(table: dict) -> str:
    """Every run's answers to the sample prompts side by side: prompt x run at each point in
    training (samples seen), the latest first and open, earlier ones folded. "" when none."""
    from rapidfire_nb.tracking.naming import short_name

    runs = [r for r in runs_by_id(table) if r["generations"]]
    if not runs:
        return ""
    points = sorted({g["samples_seen"] for r in runs for g in r["generations"]
                     if isinstance(g["samples_seen"], int)}, reverse=True)
    many_epochs = any((g["epoch"] or 0) > 0 for r in runs for g in r["generations"])
    cell = ('style="padding:3px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top;'
            'white-space:pre-wrap;max-width:28em"')
    out = [f'<p class="meta">{len(runs)} runs answer the same prompts after every chunk; at each point '
           "a run shows its latest answer up to it"
           + (" (✓: the answer equals the reference)" if any(ref is not None for r in runs for g in r["generations"]
                                                              for ref in g["references"]) else "") + ".</p>"]
    for i, x in enumerate(points[:MAX_GENERATION_POINTS]):
        latest = {}
        for r in runs:
            done = [g for g in r["generations"] if isinstance(g["samples_seen"], int) and g["samples_seen"] <= x]
            if done:
                latest[r["run_id"]] = (r, done[-1])
        # the newest answer at this point names the chunk
        newest_run, newest = max(latest.values(), key=lambda rg: rg[1]["samples_seen"])
        # one row per prompt any shown answer answered, the newest answer's first (after a resume
        # that asked other prompts, runs answered different ones)
        asked: dict = {}
        for _, g in sorted(latest.values(), key=lambda rg: rg[1] is not newest):
            for prompt, ref in zip(g["prompts"], g["references"]):
                asked.setdefault(prompt, ref)
        has_refs = any(ref is not None for ref in asked.values())
        head = [_e("prompt")] + ([_e("reference")] if has_refs else []) + [
            f'<span style="color:{run_color(r["run_id"])}">&#9632;</span> {_e(short_name(r["run_id"], r["knobs"]))}'
            for r, _ in latest.values()]
        # where each shown answer answered each prompt (its first answer to it): one pass per
        # answer, not a search of its prompts per row
        where_in = [(g, {}) for _, g in latest.values()]
        for g, index in where_in:
            for j, prompt in enumerate(g["prompts"]):
                index.setdefault(prompt, j)
        rows = []
        for prompt, ref in asked.items():
            cells = [_e(cut_text(prompt))] + ([_e(cut_text(ref)) if ref is not None else "—"] if has_refs else [])
            for g, index in where_in:
                j = index.get(prompt)
                text = g["texts"][j] if j is not None and j < len(g["texts"]) else None
                mark = " ✓" if text is not None and ref is not None and text.strip() == ref.strip() else ""
                cells.append("—" if text is None else _shown_text(text) + mark)
            rows.append("<tr>" + "".join(f"<td {cell}>{c}</td>" for c in cells) + "</tr>")
        body = ('<div style="overflow-x:auto;max-width:100%"><table style="border-collapse:collapse;font-size:13px">'
                "<thead><tr>" + "".join(f"<th {cell}>{h}</th>" for h in head) + "</tr></thead><tbody>"
                + "".join(rows) + "</tbody></table></div>")
        where = []
        if many_epochs and isinstance(newest["epoch"], int):
            where.append(f"epoch {newest['epoch'] + 1}")
        if isinstance(newest["chunk"], int):
            total = newest_run["num_chunks"]
            where.append(f"chunk {newest['chunk'] + 1}" + (f"/{total}" if isinstance(total, int) else ""))
        # a warm clone's samples count its parent's but its epochs are its own: say whose epoch
        # it is, or points sorted by samples read as epochs going back and forth (as the panel)
        own = (f"run {newest_run['run_id']}'s " if where and newest_run.get("warm_start")
               and newest_run.get("parent_run_id") is not None else "")
        summary = (f"after {x} samples" + (f" ({own}{', '.join(where)})" if where else "")
                   + (" · latest" if i == 0 else ""))
        out.append(f'<details data-samples="{x}"{" open" if i == 0 else ""}><summary>{_e(summary)}</summary>'
                   f'{body}</details>')
    if len(points) > MAX_GENERATION_POINTS:
        out.append(f'<p class="meta">{len(points) - MAX_GENERATION_POINTS} earlier points left out; '
                   "exp.get_generations() has them all.</p>")
    return "".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin-bottom: 4px; } h2 { font-size: 16px; margin-top: 28px; }
.meta { color: #555; font-size: 13px; } .fig { margin: 8px 0 16px; }
pre { background: #f6f6f6; padding: 6px; font-size: 12px; overflow-x: auto; }
"""


def report_html(table: dict, meta: dict | None = None, source: str | None = None) -> str:
    """The whole report as one HTML string (plotly.js included)."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    from rapidfire_nb.report.figures import (curves_with_x_menu, knobs_figure, resources_figure,
                                             time_split_figure, timeline_figure)

    meta = meta or {}
    name = table["experiment"] or "experiment"
    figs: list[str] = []
    for split in ("eval", "train"):
        names = list(table[f"{split}_metrics"])
        for i, metric in enumerate(names[:MAX_CURVES_PER_SPLIT]):
            fig = curves_with_x_menu(table, metric, split)
            figs.append(f'<div class="fig">{_figure_div(fig, f"curve-{split}-{i}")}</div>')
        figs.append(_left_out_note(names, split))
    facts = [f"{_e(status_counts(table))}", f"log: {_e(log_state(table))}",
             f"{table['last_seq']} events"]
    for key, label in (("num_chunks", "chunks per epoch"), ("seed", "seed")):
        if isinstance(meta.get(key), (int, str)) and not isinstance(meta.get(key), bool):
            facts.append(f"{label} {_e(meta[key])}")
    where = source or table.get("path")
    failed = [r for r in runs_by_id(table) if r["status"] == "failed" and r["error"]]
    errors = "".join(
        f"<h3>run {r['run_id']}</h3><pre>{_e(r['error'][-4000:])}</pre>" for r in failed)
    lost = table.get("lost_workers") or []
    lost_html = "".join(f"<li>{_e(w['worker'])}: {_e(w['reason'])} (runs {_e(w['runs'])})</li>"
                        for w in lost)
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
        f"<title>{_e(name)} · rapidfire_nb report</title><style>{_CSS}</style>",
        # plotly.js inline: the file opens offline, anywhere
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>',
        f"<h1>{_e(name)}</h1>",
        f'<div class="meta">{" · ".join(facts)}</div>',
        f'<div class="meta">folder: {_e(where)}</div>' if where else "",
        "<h2>Leaderboard</h2>", leaderboard_html(table),
        "<h2>Curves</h2>",
        *(figs or ["<p>No metric logged yet.</p>"]),
        # the scatter (SVG) only: plotly's parallel coordinates need WebGL, which a report opened
        # anywhere may lack (exp.plot(kind="parcoords") draws them in a notebook)
        *(["<h2>Knobs → metric</h2>",
            f'<div class="fig">{_figure_div(knobs_figure(table), "knobs-scatter")}</div>']
          if table["eval_metrics"] or table["train_metrics"] else []),
        *(["<h2>Generations</h2>", gens] if (gens := generations_html(table)) else []),
        "<h2>Engine time</h2>",
        f'<div class="fig">{_figure_div(time_split_figure(table), "time-split")}</div>',
        "<h2>Resources</h2>",
        f'<div class="fig">{_figure_div(resources_figure(table), "resources")}</div>',
        "<h2>Chunk timeline</h2>",
        f'<div class="fig">{_figure_div(timeline_figure(table), "timeline")}</div>',
        f"<h2>Lost workers</h2><ul>{lost_html}</ul>" if lost_html else "",
        f"<h2>Failures</h2>{errors}" if errors else "",
        f'<p class="meta">Written by rapidfire_nb {_e(__version__)} at '
        f"{_e(time.strftime('%Y-%m-%d %H:%M:%S'))} from the experiment's event log; plotly.js "
        f"{_e(get_plotlyjs_version())} is inside this file, so it opens without a network.</p>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def write_report(table: dict, path: str | Path, meta: dict | None = None,
                 source: str | None = None, *, overwrite: bool = True,
                 outside: str | Path | None = None) -> Path:
    """Write the report to ``path`` (a file; its folder must exist) and return the path.

    ``overwrite=False`` refuses an existing file; ``outside`` is a folder the report must not be
    written into (the experiment folder it is read from, which stays as it is)."""
    if "\x00" in str(path):
        raise ReportError(f"report path {str(path)!r} holds a NUL byte, which no file name may hold")
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{path} is a folder; give the report's file name, e.g. {path / 'report.html'}")
    if not path.parent.is_dir():
        raise ReportError(f"cannot write {path}: the folder {path.parent} does not exist")
    if outside is not None:
        guarded = Path(outside).resolve()
        # resolve() follows a link at path too: a link into the folder is refused as well
        if path.resolve().is_relative_to(guarded) or path.parent.resolve().is_relative_to(guarded):
            raise ReportError(f"will not write {path} inside the experiment folder {outside}, which the "
                              "report only reads; give a path outside it")
    if not overwrite and (path.exists() or path.is_symlink()):
        raise ReportError(f"{path} already exists; give another file name, or --force to replace it")
    text = report_html(table, meta, source)
    from rapidfire_nb.engine import atomic_write_text

    try:
        # a temporary file of its own, never one found there (a planted link or hard link), then
        # renamed over ``path``: a link at ``path`` is replaced, not written through
        atomic_write_text(path, text)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path
