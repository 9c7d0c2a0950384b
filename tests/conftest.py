"""Shared fixtures: tiny offline model/tokenizer/datasets; engine output stays out of the console."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RF_TENSORBOARD_ENABLED", "0")  # tracking tests turn it on themselves


@pytest.fixture(scope="session")
def tiny_data():
    from rapidfire_nb.demo_data import make_demo_datasets

    return make_demo_datasets(64, 16)


@pytest.fixture
def exp_path(tmp_path):
    return tmp_path / "experiments"
