"""Short alias so that ``%load_ext rapidfire`` works; everything lives in ``rapidfire_nb``."""
from rapidfire_nb import *  # noqa: F401,F403
from rapidfire_nb import load_ipython_extension, unload_ipython_extension  # noqa: F401
