"""``rapidfireai.fit.db.rf_db.RfDb``: the one call RapidFire's notebooks make, to find paths.

There is no database here; ``RfDb().get_experiments_path(name)`` answers from the experiment
folders, with RapidFire's meaning: the *parent* folder of the experiment (``experiment_path``,
default ``./rapidfire_experiments``). So the paths those notebooks build from it exist:

- ``<experiments path>/tensorboard_logs/<name>/``: a link to the experiment's TensorBoard folder
  (``<experiments path>/<name>/tensorboard/``), made when the experiment is created (and by this
  call for a folder whose link is missing);
- ``<experiments path>/<name>/runs/<id>/checkpoints/final_checkpoint/``: written when each run
  completes.
"""

from __future__ import annotations

from pathlib import Path

from rapidfire_nb.errors import ConfigError


def _find(experiment_name: str) -> Path:
    from rapidfire_nb.session import current_experiment

    from rapidfire_nb.engine import check_experiment_name

    # a name, never a path: "../../x" or "/tmp/x" would make the TensorBoard folder and link
    # below land outside ./rapidfire_experiments
    check_experiment_name(experiment_name, "RfDb.get_experiments_path: experiment_name")

    exp = current_experiment()
    if exp is not None and exp.name == experiment_name:
        return Path(exp.path)
    here = Path("rapidfire_experiments") / experiment_name
    if (here / "experiment.json").exists():
        return here.resolve()
    raise ConfigError(f"RfDb.get_experiments_path: no experiment named {experiment_name!r} is open, "
                      f"and ./rapidfire_experiments/{experiment_name} does not exist; create it with "
                      f"Experiment(experiment_name={experiment_name!r}) first")


class RfDb:
    """RapidFire's database handle, reduced to ``get_experiments_path`` (no database here)."""

    def get_experiments_path(self, experiment_name: str) -> Path:
        """The folder that holds experiment ``experiment_name`` (RapidFire's experiments path)."""
        from rapidfire_nb.session import tensorboard_link

        exp_path = _find(experiment_name)
        tensorboard_link(exp_path)
        return exp_path.parent

    def __getattr__(self, name: str):
        raise AttributeError(f"RfDb.{name}: there is no database in rapidfire_nb; runs are in "
                             "Experiment.get_runs_info() and metrics in Experiment.get_results()")
