"""Property tests (hypothesis) for expansion: the number of runs is the product of the axis lengths
(summed over the branches of a List), knobs are exactly the axes that vary, and random search draws
distinct points of the grid, deterministically."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapidfire_nb.automl import (
    List, RFGridSearch, RFLoraConfig, RFModelConfig, RFRandomSearch, RFSFTConfig,
)
from rapidfire_nb.errors import ConfigError

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def axis(values: list, as_list: bool):
    """A knob value: a List axis, or one fixed value (then the axis length is 1)."""
    return (List(values), len(values)) if as_list else (values[0], 1)


@st.composite
def lora_configs(draw):
    r, n_r = axis(draw(st.lists(st.sampled_from([2, 4, 8, 16]), min_size=1, max_size=3, unique=True)),
                  draw(st.booleans()))
    drop, n_d = axis(draw(st.lists(st.sampled_from([0.0, 0.05, 0.1]), min_size=1, max_size=2, unique=True)),
                     draw(st.booleans()))
    modules = draw(st.sampled_from([["q_proj"], ["q_proj", "v_proj"]]))       # a plain list: one value
    return RFLoraConfig(r=r, lora_dropout=drop, target_modules=modules), n_r * n_d


@st.composite
def model_configs(draw):
    kind = draw(st.sampled_from(["none", "one", "list"]))
    if kind == "none":
        peft, n_peft = None, 1
    elif kind == "one":
        peft, n_peft = draw(lora_configs())
    else:
        loras = draw(st.lists(lora_configs(), min_size=1, max_size=3))
        peft, n_peft = List([c for c, _ in loras]), sum(n for _, n in loras)
    lr, n_lr = axis(draw(st.lists(st.sampled_from([1e-3, 5e-4, 1e-4, 2e-5]), min_size=1, max_size=3,
                                  unique=True)), draw(st.booleans()))
    epochs, n_ep = axis(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True)),
                        draw(st.booleans()))
    dtype, n_dt = axis(draw(st.lists(st.sampled_from(["float32", "bfloat16"]), min_size=1, max_size=2,
                                     unique=True)), draw(st.booleans()))
    cfg = RFModelConfig(
        model_name=draw(st.sampled_from(["tiny-a", "tiny-b"])),
        peft_config=peft,
        training_args=RFSFTConfig(learning_rate=lr, num_train_epochs=epochs, per_device_train_batch_size=2),
        model_kwargs={"torch_dtype": dtype, "layers": [1, 2]},
    )
    return cfg, n_peft * n_lr * n_ep * n_dt


@st.composite
def groups(draw):
    configs = draw(st.lists(model_configs(), min_size=1, max_size=3))
    if len(configs) == 1 and draw(st.booleans()):
        return configs[0]
    return List([c for c, _ in configs]), sum(n for _, n in configs)


@SETTINGS
@given(groups())
def test_grid_size_is_the_product_of_axis_lengths(group):
    configs, expected = group
    specs = RFGridSearch(configs, trainer_type="SFT").expand()
    assert len(specs) == expected
    # plain lists stay single values
    assert all(s.model_kwargs["layers"] == [1, 2] for s in specs)
    assert all(s.peft_config is None or isinstance(s.peft_config["target_modules"], list) for s in specs)


@SETTINGS
@given(groups())
def test_knobs_are_exactly_the_values_that_vary(group):
    configs, _ = group
    specs = RFGridSearch(configs, trainer_type="SFT").expand()
    keys = {tuple(sorted(s.knobs)) for s in specs}
    assert len(keys) == 1                                  # every run has the same knob columns
    flat = [s.config_dict() for s in specs]
    for key in next(iter(keys)):
        section, _, name = key.partition(".")
        values = {json.dumps((f.get(section) or {}).get(name) if name else f.get(section), sort_keys=True)
                  for f in flat}
        assert len(values) > 1, key
    # and every varying leaf value is among the knobs
    for section in ("training_args", "peft_config", "model_kwargs"):
        names = set().union(*[set(f.get(section) or {}) for f in flat])
        for name in names:
            values = {json.dumps((f.get(section) or {}).get(name), sort_keys=True) for f in flat}
            if len(values) > 1:
                assert f"{section}.{name}" in specs[0].knobs


@SETTINGS
@given(groups(), st.integers(0, 2**16), st.integers(1, 6))
def test_random_search_draws_distinct_grid_points_deterministically(group, seed, num_runs):
    configs, grid_size = group
    grid = RFGridSearch(configs, trainer_type="SFT").expand()
    distinct_grid = {json.dumps(s.config_dict(), sort_keys=True) for s in grid}
    if num_runs > grid_size:
        with pytest.raises(ConfigError):
            RFRandomSearch(configs, "SFT", num_runs=num_runs, seed=seed).expand()
        return
    if num_runs > len(distinct_grid):      # equal configs in different branches
        with pytest.raises(ConfigError, match="distinct"):
            RFRandomSearch(configs, "SFT", num_runs=num_runs, seed=seed).expand()
        return
    first = RFRandomSearch(configs, "SFT", num_runs=num_runs, seed=seed).expand()
    again = RFRandomSearch(configs, "SFT", num_runs=num_runs, seed=seed).expand()
    drawn = [json.dumps(s.config_dict(), sort_keys=True) for s in first]
    assert drawn == [json.dumps(s.config_dict(), sort_keys=True) for s in again]
    assert len(set(drawn)) == num_runs
    assert set(drawn) <= distinct_grid


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_grid_size_of_independent_axes(lengths):
    values = [1e-3, 1e-4, 1e-5, 2e-5]
    knobs = ["learning_rate", "weight_decay", "max_grad_norm", "adam_epsilon"]
    kwargs = {k: List(values[:n]) for k, n in zip(knobs, lengths)}
    specs = RFGridSearch(RFModelConfig("m", training_args=RFSFTConfig(**kwargs)), "SFT").expand()
    assert len(specs) == math.prod(lengths)
    # the first-declared axis varies slowest
    first = knobs[0]
    column = [s.training_args[first] for s in specs]
    block = len(specs) // lengths[0]
    assert column == [v for v in values[:lengths[0]] for _ in range(block)]
