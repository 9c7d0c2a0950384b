"""Notebook integration: the anywidget control panel (``panel``), the ``%rapidfire`` magics and the
TensorBoard view. Importing this package is cheap; ``Panel``/``panel_for`` load anywidget on use."""

from __future__ import annotations

from typing import Any

__all__ = ["Panel", "panel_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rapidfire_nb.notebook import panel

        return getattr(panel, name)
    raise AttributeError(f"module 'rapidfire_nb.notebook' has no attribute {name!r}")
