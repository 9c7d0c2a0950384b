"""Interleaved equals alone with gradient accumulation and with clipping on and off (0), for SFT, DPO and GRPO: the step's token count (``Trainer.get_batch_samples``) and the
clipping (``Accelerator.clip_grad_norm_``) are per run, whatever trains between its chunks."""

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (List, RFDPOConfig, RFGridSearch, RFGRPOConfig, RFLoraConfig,
                                 RFModelConfig, RFSFTConfig)
from rapidfire_nb.demo_data import make_demo_datasets, make_dpo_dataset, make_grpo_dataset, tiny_create_model
from rapidfire_nb.errors import ConfigError

from helpers import PREFERENCE_LORA as LORA
from helpers import short_answer

CLIPS = [0.05, 0.0]    # clipped hard (so it bites), off


def args(kind, clip):
    common = dict(learning_rate=2e-2, gradient_accumulation_steps=2, num_train_epochs=1, bf16=False,
                  max_grad_norm=clip)
    if kind == "SFT":
        return RFSFTConfig(per_device_train_batch_size=2, max_length=64, **common)
    if kind == "DPO":
        return RFDPOConfig(per_device_train_batch_size=2, beta=0.1, max_length=48, **common)
    return RFGRPOConfig(per_device_train_batch_size=4, num_generations=2, max_completion_length=4, **common)


def config(kind, clip):
    extra = {"reward_funcs": [short_answer]} if kind == "GRPO" else {}
    return RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args(kind, clip),
                         **extra)


def data(kind):
    if kind == "SFT":
        return make_demo_datasets(16, 4)[0]
    return make_dpo_dataset(16, seed=0) if kind == "DPO" else make_grpo_dataset(8, seed=0)


def final_state(exp, run_id):
    weights = exp.engine.run_weights(run_id)
    out = {}
    for k, v in weights.items():
        parts = k.split(".")
        out[".".join("run_X" if i > 0 and parts[i - 1] in ("lora_A", "lora_B") else p
                     for i, p in enumerate(parts))] = v
    df = exp.get_results()
    df = df[(df.run_id == run_id) & (df.split == "train") & (df.metric != "step_time")]
    return out, {(int(r.step), r.metric): r.value for r in df.itertuples()}


@pytest.mark.parametrize("kind", ["SFT", "DPO", "GRPO"])
def test_interleaved_equals_alone_with_accumulation_and_every_clipping(kind, tmp_path):
    train = data(kind)
    grid = Experiment(f"{kind}-grid", experiment_path=tmp_path, tracking=[])
    grid.run_fit(RFGridSearch(List([config(kind, c) for c in CLIPS]), trainer_type=kind), tiny_create_model,
                 train, None, num_chunks=2, seed=11)
    info = grid.get_runs_info().set_index("run_id")
    assert set(info.status) == {"completed"}, info.error.tolist()
    for run_id, clip in enumerate(CLIPS, start=1):
        assert grid.engine.snapshot()[run_id].spec.training_args["gradient_accumulation_steps"] == 2
        alone = Experiment(f"{kind}-alone-{run_id}", experiment_path=tmp_path, tracking=[])
        alone.run_fit(RFGridSearch(config(kind, clip), trainer_type=kind), tiny_create_model, train, None,
                      num_chunks=2, seed=11)
        (w_grid, log_grid), (w_alone, log_alone) = final_state(grid, run_id), final_state(alone, 1)
        alone.end()
        assert w_grid.keys() == w_alone.keys() and len(w_grid) > 0
        for k in w_grid:
            assert torch.equal(w_grid[k], w_alone[k]), (clip, k)
        assert log_grid == log_alone, clip
        norms = [v for (_, m), v in log_grid.items() if m == "grad_norm"]
        if clip:
            # clipping is on and bites: the pre-clip norm is logged and exceeds the limit
            assert norms and max(norms) > clip, norms
        else:
            assert not norms
    # clipping changed the training: the clipped run ends elsewhere than the unclipped ones
    clipped, off = (final_state(grid, i)[0] for i in (1, 2))
    assert any(not torch.equal(clipped[k], off[k]) for k in clipped)
    grid.end()


@pytest.mark.parametrize("kind", ["SFT", "DPO", "GRPO"])
def test_max_grad_norm_none_is_refused_naming_the_knob(kind):
    # transformers compares max_grad_norm with 0 at every step: None is refused up front
    with pytest.raises(ConfigError, match="max_grad_norm' expects float, got NoneType None"):
        args(kind, None)
