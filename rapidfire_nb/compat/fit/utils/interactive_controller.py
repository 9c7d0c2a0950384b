"""``rapidfireai.fit.utils.interactive_controller.InteractiveController``: our panel.

RapidFire's controller is a widget that talks to its dispatcher over HTTP. Here the panel of the
current experiment does the same job (Stop, Resume, Delete, Clone-modify), so
``InteractiveController(dispatcher_url=...).display()`` shows that panel; ``dispatcher_url`` is
accepted and unused (there is no dispatcher).
"""

from __future__ import annotations

from rapidfire_nb.errors import RapidFireError


class InteractiveController:
    def __init__(self, dispatcher_url: str | None = None, experiment=None):
        self.dispatcher_url = dispatcher_url   # no dispatcher here: kept for code that reads it
        self._experiment = experiment

    def _exp(self):
        from rapidfire_nb.session import current_experiment

        exp = self._experiment or current_experiment()
        if exp is None:
            raise RapidFireError("InteractiveController: no experiment is open; create one with "
                                 "Experiment(...) and call run_fit first (its panel is this controller)")
        return exp

    def display(self):
        """Show the current experiment's panel in the notebook and return it."""
        panel = self._exp().panel()
        try:
            from IPython.display import display

            display(panel)
        except ImportError:
            pass
        return panel

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self._exp()._repr_mimebundle_(include=include, exclude=exclude)
