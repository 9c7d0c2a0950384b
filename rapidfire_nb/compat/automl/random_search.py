"""``rapidfireai.automl.random_search``: the same names from ``rapidfire_nb.automl``."""

from rapidfire_nb.automl import RFRandomSearch

__all__ = ["RFRandomSearch"]
