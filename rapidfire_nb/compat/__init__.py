"""RapidFire AI's module paths mapped onto this package: replace ``rapidfireai`` with
``rapidfire_nb.compat`` in an import and it finds our equivalent.

    from rapidfire_nb.compat import Experiment                                   # rapidfireai
    from rapidfire_nb.compat.automl import List, RFGridSearch, RFModelConfig     # rapidfireai.automl
    from rapidfire_nb.compat.fit.db.rf_db import RfDb                            # paths
    from rapidfire_nb.compat.fit.utils.interactive_controller import InteractiveController
    from rapidfire_nb.compat.utils.metric_rfmetric_manager import RFMetricLogger
    from rapidfire_nb.compat.utils.notebook_ui import NotebookUI, end_experiment_button

Each face is small and points at our own feature (see its docstring and the README's "Porting
RapidFire AI code" table). A RapidFire module with no equivalent here (its evals/RAG mode, its
dispatcher, its database) fails to import with an ``ImportError`` that says what to use instead,
never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib.abc
import sys

from rapidfire_nb._version import __version__
from rapidfire_nb.experiment import Experiment

__all__ = ["Experiment", "NO_EQUIVALENT", "__version__"]

# RapidFire module (under rapidfireai.) -> what to use instead
NO_EQUIVALENT = {
    "evals": "rapidfire_nb fine-tunes (run_fit); RapidFire's evals/RAG mode (run_evals) has no "
             "equivalent here",
    "fit.dispatcher": "there is no dispatcher server: ops are Experiment methods (stop, resume, "
                      "delete, clone_modify) and the panel's buttons",
    "fit.backend": "the engine runs inside the kernel: Experiment.run_fit drives it",
    "fit.db.db_interface": "there is no database: the experiment folder holds events.jsonl and "
                           "runs.json; read runs with Experiment.get_runs_info()",
    "utils.colab": "nothing to set up on Colab: %load_ext rapidfire and Experiment(...) work there",
    "frontend": "there is no web dashboard to start: the panel lives in the notebook",
    "cli": "there are no services to start; the `rapidfire` command offers demo, bench and report",
}


class _NoEquivalentFinder(importlib.abc.MetaPathFinder):
    """Turns an import of a RapidFire module we do not map into an error that says what to do."""

    prefix = __name__ + "."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        rest = fullname[len(self.prefix):]
        for mod, advice in NO_EQUIVALENT.items():
            if rest == mod or rest.startswith(mod + "."):
                raise ImportError(f"rapidfireai.{rest} has no equivalent in rapidfire_nb: {advice}",
                                  name=fullname)
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is not None and find(fullname, path, target) is not None:
                return None   # a real module of ours: let the normal machinery import it
        raise ImportError(
            f"rapidfireai.{rest} is not mapped in rapidfire_nb.compat; the mapped names are listed in "
            "the README's 'Porting RapidFire AI code' table (Experiment, experiment, automl and its "
            "datatypes/grid_search/random_search/optuna_search/model_config, fit.db.rf_db.RfDb, "
            "fit.utils.interactive_controller.InteractiveController, "
            "utils.metric_rfmetric_manager.RFMetricLogger, utils.notebook_ui.NotebookUI and "
            "end_experiment_button)", name=fullname)


if not any(isinstance(f, _NoEquivalentFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _NoEquivalentFinder())
