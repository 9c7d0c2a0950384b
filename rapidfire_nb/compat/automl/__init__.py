"""``rapidfireai.automl``: our config API under RapidFire's path (see ``rapidfire_nb.automl``)."""

from rapidfire_nb.automl import *  # noqa: F401,F403
from rapidfire_nb.automl import __all__  # noqa: F401
