"""AutoML at chunk boundaries: the driver (``driver``), RFOptuna's study (``optuna``), the pruning
policies (``pruners``) and the objective's checks (``objective``). The config classes it reads
live in ``rapidfire_nb.automl``; run_fit's launcher attaches the driver to the engine."""

from rapidfire_nb.tuning.driver import (
    CONFIRM, IGNORE, SUGGESTED, ChunkAutoML, check_pruning_resume, driver_for, needs_driver,
    pruning_settings,
)
from rapidfire_nb.tuning.objective import check_objective_is_logged

__all__ = ["ChunkAutoML", "driver_for", "needs_driver", "pruning_settings", "check_pruning_resume",
           "check_objective_is_logged", "SUGGESTED", "CONFIRM", "IGNORE"]
