"""Shared fixtures: tiny offline model/tokenizer/datasets; engine output stays out of the console."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RF_TENSORBOARD_ENABLED", "0")  # tracking tests turn it on themselves
# Ray on Linux turns a loopback node address ("127.0.0.1") into the machine's network address
# (ray._private.services.resolve_ip_for_localhost) unless its multi-machine mode is off, which
# this variable does; read when ray is imported, so it is set before any test module imports it.
# With it, every Ray the tests start (ray.init and ray.cluster_utils.Cluster alike, each given
# 127.0.0.1) listens on loopback alone, and so does a gang's rendezvous (engine/fsdp.py)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def tiny_data():
    from rapidfire_nb.demo_data import make_demo_datasets

    return make_demo_datasets(64, 16)


@pytest.fixture
def exp_path(tmp_path):
    return tmp_path / "experiments"


@pytest.fixture(autouse=True)
def _no_engine_outlives_its_test():
    """run_fit refuses while another experiment of the process trains; a test that leaves one
    training would make a later, unrelated test fail with that refusal. End what is left."""
    yield
    import sys

    exp_mod = sys.modules.get("rapidfire_nb.experiment")
    if exp_mod is not None and hasattr(exp_mod, "end_training"):
        try:
            exp_mod.end_training()
        except Exception:   # a test that broke its engine on purpose leaves nothing to end
            pass
