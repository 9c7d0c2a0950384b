"""rapidfire_nb: train many fine-tuning configurations at once, by chunk interleaving, from a notebook.

    %load_ext rapidfire
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFModelConfig, RFLoraConfig, RFSFTConfig, RFGridSearch
"""

from rapidfire_nb import _views
from rapidfire_nb._compat import check_versions
from rapidfire_nb._version import __version__

check_versions()   # TRL/transformers/peft/accelerate/datasets within the tested ranges, or a clear ImportError

__all__ = ["Experiment", "__version__", "load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name):
    # Importing torch/transformers takes seconds: keep `import rapidfire_nb` (and %load_ext) light.
    if name == "Experiment":
        from rapidfire_nb.experiment import Experiment

        return Experiment
    raise AttributeError(f"module 'rapidfire_nb' has no attribute {name!r}")


def _panel_view(experiment):
    from rapidfire_nb.notebook.panel import panel_for

    return panel_for(experiment)


def _tensorboard_view(experiment):
    from rapidfire_nb.notebook.tensorboard import show_tensorboard

    return show_tensorboard(experiment)


# the facade shows itself through these without importing the notebook layer above it
_views.register("panel", _panel_view)
_views.register("tensorboard", _tensorboard_view)


def load_ipython_extension(ipython):
    from rapidfire_nb.notebook.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython):
    from rapidfire_nb.notebook.magics import unload_ipython_extension as _unload

    _unload(ipython)
