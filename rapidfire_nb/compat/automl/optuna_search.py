"""``rapidfireai.automl.optuna_search``: the same names from ``rapidfire_nb.automl``."""

from rapidfire_nb.automl import RFOptuna

__all__ = ["RFOptuna"]
