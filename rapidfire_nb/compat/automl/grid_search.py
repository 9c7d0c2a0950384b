"""``rapidfireai.automl.grid_search``: the same names from ``rapidfire_nb.automl``."""

from rapidfire_nb.automl import RFGridSearch

__all__ = ["RFGridSearch"]
