"""export writes files whose tensors fit the model and load back exactly (issue 15, item 9).

Before issue 15 the adapter file was written by renaming keys by hand: a ``modules_to_save``
run's file did not load (PEFT looks for the wrapped module's own name), and nothing checked the
tensors against the model.
"""

from __future__ import annotations

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.engine.export import ExportError, export_adapter

LORAS = [dict(r=4, target_modules=["q_proj"], use_dora=True),
         dict(r=4, target_modules=["v_proj"], modules_to_save=["lm_head"])]


def config(peft):
    return RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(**peft) if peft else None,
        training_args=RFSFTConfig(learning_rate=1e-2, per_device_train_batch_size=4,
                                  num_train_epochs=1, max_length=64, bf16=False))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    train, evald = make_demo_datasets(16, 4)
    exp = Experiment("export", experiment_path=root, tracking=[])
    exp.run_fit(RFGridSearch(List([config(LORAS[0]), config(LORAS[1]), config(None)]),
                             trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2)
    assert set(exp.get_runs_info().status) == {"completed"}
    yield exp, root
    exp.end()


@pytest.mark.parametrize("run_id", [1, 2])
def test_exported_adapter_loads_onto_a_fresh_base_with_every_tensor_equal(trained, run_id):
    from peft import PeftModel

    exp, root = trained
    path = exp.export(run_id, root / f"adapter{run_id}")
    model, _ = tiny_create_model({"model_kwargs": {}})
    loaded = PeftModel.from_pretrained(model, str(path)).state_dict()
    weights = exp.engine.run_weights(run_id)
    assert weights
    for k, v in weights.items():
        key = ".".join("default" if p == f"run_{run_id}" else p for p in k.split("."))
        assert key in loaded and loaded[key].shape == v.shape and torch.equal(loaded[key], v), k


def test_exported_full_model_loads_with_every_tensor_equal(trained):
    from transformers import AutoModelForCausalLM

    exp, root = trained
    path = exp.export(3, root / "full")
    loaded = AutoModelForCausalLM.from_pretrained(str(path)).state_dict()
    for k, v in exp.engine.run_weights(3).items():
        assert loaded[k].shape == v.shape and torch.equal(loaded[k], v), k


def test_weights_that_do_not_fit_the_model_are_refused(trained, tmp_path):
    exp, _ = trained
    from rapidfire_nb.experiment import build_lora_config

    spec = exp.engine.snapshot()[1].spec
    base = exp.engine.factory.bases[spec.base_key()].model
    weights = dict(exp.engine.run_weights(1))
    key = next(k for k in weights if "lora_A" in k)
    wrong = dict(weights, **{key: torch.zeros(8, weights[key].shape[1])})   # rank 8, not 4
    with pytest.raises(ExportError, match="do not fit the model"):
        export_adapter(base, build_lora_config(spec), wrong, "run_1", tmp_path)
    with pytest.raises(ExportError, match="missing"):
        export_adapter(base, build_lora_config(spec), {k: v for k, v in weights.items() if k != key},
                       "run_1", tmp_path)
    assert not (tmp_path / "adapter_model.safetensors").exists()
