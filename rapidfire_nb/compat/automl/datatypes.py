"""``rapidfireai.automl.datatypes``: the same names from ``rapidfire_nb.automl``."""

from rapidfire_nb.automl import List, Range

__all__ = ["List", "Range"]
