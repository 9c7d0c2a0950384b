"""``rapidfireai.experiment``: where RapidFire defines ``Experiment``; ours is the same class."""

from rapidfire_nb.experiment import Experiment

__all__ = ["Experiment"]
