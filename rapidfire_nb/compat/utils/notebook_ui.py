"""``rapidfireai.utils.notebook_ui``: RapidFire AI 0.16.2's notebook controls, as ours.

- ``NotebookUI(mode="fit", dispatcher_url=...).display()`` shows the current experiment's panel
  (RapidFire's is an HTML panel that polls its dispatcher; ours is the experiment's live panel,
  with the same Stop / Resume / Delete / Clone-modify). Shown before ``run_fit``, it fills in as
  the runs start.
- ``end_experiment_button(experiment)`` shows an "End experiment" button that ends the experiment
  when clicked. RapidFire's blocks the cell until the click, which its panel survives because it
  talks to a separate server over HTTP; ours lives on the kernel's own messages, which a blocked
  cell would hold back, so the button returns at once everywhere and never blocks a kernel.
"""

from __future__ import annotations

import threading
from typing import Any

from rapidfire_nb.errors import RapidFireError
from rapidfire_nb.experiment_view import view_of

__all__ = ["NotebookUI", "end_experiment_button"]

_MODES = ("fit", "evals")


def _experiment(experiment, who: str):
    from rapidfire_nb.session import current_experiment

    exp = experiment if experiment is not None else current_experiment()
    if exp is None:
        raise RapidFireError(f"{who}: no experiment is open; create one with Experiment(...) first "
                             "(its panel is what this shows)")
    return exp


def _display(obj) -> None:
    try:
        from IPython.display import display
    except ImportError:
        return
    display(obj)


class NotebookUI:
    """RapidFire AI's "Interactive Run Controller": here, the current experiment's panel.

    ``dispatcher_url`` and ``refresh_rate_seconds`` are accepted and kept for code that reads
    them; there is no dispatcher (the panel talks to the kernel), and the panel refreshes itself.
    """

    def __init__(self, mode: str, dispatcher_url: str = "http://127.0.0.1:8851",
                 refresh_rate_seconds: float = 3.0, experiment=None):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {list(_MODES)}, got {mode!r}")
        if mode == "evals":
            raise RapidFireError("NotebookUI(mode='evals'): RapidFire's evals/RAG mode has no "
                                 "equivalent in rapidfire_nb; mode='fit' shows the training panel")
        self.mode = mode
        self.dispatcher_url = dispatcher_url
        self.refresh_rate = refresh_rate_seconds
        self._experiment = experiment

    def display(self):
        """Show the current experiment's panel in the notebook and return it."""
        panel = _experiment(self._experiment, "NotebookUI.display").panel()
        _display(panel)
        return panel

    def _repr_mimebundle_(self, include=None, exclude=None):
        exp = _experiment(self._experiment, "NotebookUI")
        return exp._repr_mimebundle_(include=include, exclude=exclude)


class EndButton:
    """The widget ``end_experiment_button`` shows: a button and a line saying what happened.

    A click while runs still train ends the experiment now, as ``end(wait=False)`` does: they stop
    at their next chunk boundary as ``stopped`` (resumable with ``Experiment(name, resume=True)``).
    The ending runs on a thread of its own, because a click is handled on the kernel's message
    loop, which must not wait for a chunk to finish."""

    def __init__(self, experiment):
        import ipywidgets as widgets

        self.experiment = experiment
        self.button = widgets.Button(description="End experiment", button_style="danger",
                                     tooltip=f"end experiment {experiment.name!r}")
        self.label = widgets.Label(value="")
        self.widget = widgets.HBox([self.button, self.label])
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._shown = False
        self.button.on_click(self._clicked)
        if experiment.ended:
            self._show_ended()

    def _show_ended(self) -> None:
        self.button.disabled = True
        self.button.description = "Ended"
        self.label.value = f"experiment {self.experiment.name!r} has ended"

    def _clicked(self, _button=None) -> None:
        if self.experiment.ended:
            self._show_ended()
            return
        if self.thread is not None:   # a second click while it ends
            return
        self.button.disabled = True
        self.button.description = "Ending…"
        training = view_of(self.experiment).busy(timeout=0.2)
        self.label.value = ("unfinished runs stop at their next chunk boundary (resumable)…"
                            if training else "")
        self.thread = threading.Thread(target=self._end, name="rapidfire-end-button", daemon=True)
        self.thread.start()

    def _end(self) -> None:
        try:
            self.experiment.end(wait=False)
        except BaseException as exc:   # shown on the button's line: a click has no cell to raise in
            self.error = exc
            self.button.description = "End failed"
            self.label.value = f"{type(exc).__name__}: {exc}"
            return
        self._show_ended()   # on the button's line: a print here would land in whatever cell runs

    def wait(self, timeout: float | None = None) -> bool:
        """After a click: block until the experiment has ended (True) or ``timeout`` passed."""
        if self.thread is None:
            return self.experiment.ended
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def click(self) -> None:
        """What clicking the button does (for scripts and tests)."""
        self.button.click()

    def _ipython_display_(self):
        # end_experiment_button showed the widget already; as a cell's last line (the way the
        # tutorials call it) it would show a second copy
        if not self._shown:
            self._shown = True
            _display(self.widget)


def end_experiment_button(experiment: Any = None) -> EndButton:
    """Show an "End experiment" button that ends ``experiment`` (default: the current one) when
    clicked, and return it at once: the kernel stays free, so the panel's buttons and the next
    cells work meanwhile. RapidFire AI's blocks until the click; in a notebook run top to bottom,
    the cells after ``run_fit`` that read results wait for the runs instead (see the porting
    page). Outside a notebook it prints how to end the experiment."""
    exp = _experiment(experiment, "end_experiment_button")
    button = EndButton(exp)
    from rapidfire_nb._environment import in_kernel

    if in_kernel():
        button._ipython_display_()
    else:
        print(f"rapidfire: end_experiment_button shows a button in a notebook; here, call "
              f"{exp.name!r}'s .end() when you are done (or .click() on the returned button)")
    return button
