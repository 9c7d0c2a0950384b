"""Results that need no kernel to view: plotly figures and a self-contained HTML report.

    exp.plot("loss")                       # a plotly Figure of a live or finished experiment
    exp.report("report.html")              # one HTML file, plotly.js inside
    rapidfire report rapidfire_experiments/sft-demo -o report.html   # from a folder, no kernel

Everything draws from the reducer's run table (``engine/state.py``): ``Experiment`` hands its
live table, ``read_folder`` folds a folder's event log without taking its lock.
"""

import importlib

# plotly's graph_objects take a while to import: the panel's static fallback (page, model) does
# not need them, so names load from their module on first use.
_WHERE = {
    "curves_figure": "figures", "plot_figure": "figures", "time_split_figure": "figures", "timeline_figure": "figures",
    "ReportError": "model", "read_folder": "model", "snapshot": "model",
    "fallback_html": "page", "leaderboard_html": "page", "report_html": "page",
    "write_report": "page",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"rapidfire_nb.report.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'rapidfire_nb.report' has no attribute {name!r}")
