"""Where the notebook layer plugs its views of an experiment in.

The facade (``experiment.py``) sits below the notebook layer (the panel widget, the TensorBoard
frame) and must not import it; it asks this registry for a view by name instead. The package's
face (``rapidfire_nb/__init__.py``), above both, registers the notebook's views when the package
is imported, which happens before any of its modules runs, so the views are always there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_VIEWS: dict[str, Callable[[Any], Any]] = {}


def register(name: str, factory: Callable[[Any], Any]) -> None:
    """``factory(experiment)`` builds the view called ``name`` (``"panel"``, ``"tensorboard"``)."""
    _VIEWS[name] = factory


def show(name: str, experiment: Any) -> Any:
    """The view ``name`` of ``experiment``, built by the factory the notebook layer registered."""
    factory = _VIEWS.get(name)
    if factory is None:
        raise RuntimeError(f"no {name!r} view is registered (they come with `import rapidfire_nb`)")
    return factory(experiment)
