"""export writes files whose tensors fit the model and load back exactly.

The adapter file holds PEFT's saved form (``get_peft_model_state_dict``), not keys renamed by
hand: a ``modules_to_save`` run's file loads (PEFT looks for the wrapped module's own name), and
weights that do not fit the model are refused. Warm starts copy adapters through PEFT's state
dicts the same way.
"""

from __future__ import annotations

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.engine.export import (ExportError, adapter_state_dict, export_adapter,
                                        load_adapter_state)

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
    # what the folder holds at the moment each run is logged completed
    exp.completed_with = {}
    exp.events.subscribe(lambda ev: exp.completed_with.setdefault(ev["run_id"], sorted(
        p.name for p in exp.final_checkpoint_path(ev["run_id"]).glob("*")))
        if ev.get("type") == "run_status" and ev.get("status") == "completed" else None)
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
    from rapidfire_nb.automl import build_lora_config

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


@pytest.mark.parametrize("peft", LORAS, ids=["dora", "modules_to_save"])
def test_warm_start_copies_one_adapter_into_another_through_peft_state_dicts(peft):
    """A warm clone's adapter gets its parent's values exactly, whatever the adapter names, from
    the parent's live adapter and from its checkpointed (live-named) weights alike."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    # save_embedding_layers=False as in the engine: "auto" may add the base's lm_head (peft 0.18)
    base, _ = tiny_create_model({"model_kwargs": {}})
    lora = LoraConfig(**peft)
    model = get_peft_model(base, lora, adapter_name="run_1")
    model.add_adapter("run_2", lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "run_1" in name.split("."):
                p.normal_()   # a trained parent: nothing equals a fresh init by chance
    checkpoint = {n: p.detach().clone() for n, p in model.named_parameters()
                  if "run_1" in n.split(".")}
    parent = get_peft_model_state_dict(model, adapter_name="run_1", save_embedding_layers=False)

    load_adapter_state(model, "run_2", adapter_state_dict(base, lora, checkpoint, "run_1"))
    child = get_peft_model_state_dict(model, adapter_name="run_2", save_embedding_layers=False)
    assert child.keys() == parent.keys()
    assert all(torch.equal(child[k], parent[k]) for k in parent)

    model.add_adapter("run_3", lora)
    keys = set(parent)
    load_adapter_state(model, "run_3", parent)   # from the live parent
    assert set(parent) == keys   # the caller's dict is left as it was
    assert all(torch.equal(v, parent[k]) for k, v in
               get_peft_model_state_dict(model, adapter_name="run_3", save_embedding_layers=False).items())


def test_warm_start_state_that_does_not_fit_is_refused_and_changes_nothing():
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    base, _ = tiny_create_model({"model_kwargs": {}})
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]), adapter_name="run_1")
    model.add_adapter("run_2", LoraConfig(r=8, target_modules=["q_proj"]))
    before = {k: v.clone() for k, v in get_peft_model_state_dict(
        model, adapter_name="run_2", save_embedding_layers=False).items()}
    parent = get_peft_model_state_dict(model, adapter_name="run_1", save_embedding_layers=False)
    with pytest.raises(ExportError, match="of another shape"):
        load_adapter_state(model, "run_2", parent)
    with pytest.raises(ExportError, match="missing"):
        load_adapter_state(model, "run_1", dict(list(parent.items())[1:]))
    after = get_peft_model_state_dict(model, adapter_name="run_2", save_embedding_layers=False)
    assert all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("run_id", [1, 2])
def test_a_completed_runs_final_checkpoint_holds_its_adapter_before_end(trained, run_id):
    """RapidFire's layout, as its notebooks read it after training: the best run's
    final_checkpoint folder loads with PeftModel.from_pretrained, before end(), every tensor the
    run's (a DoRA run and a modules_to_save run: PEFT's own names)."""
    from peft import PeftModel

    exp, _ = trained
    final = exp.final_checkpoint_path(run_id)
    # whole when the run was logged completed (trainer_state.json follows from the log)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(exp.completed_with[run_id])
    assert (final / "trainer_state.json").is_file()
    model, _ = tiny_create_model({"model_kwargs": {}})
    loaded = PeftModel.from_pretrained(model, str(final)).state_dict()
    weights = exp.engine.run_weights(run_id)
    assert weights
    for k, v in weights.items():
        key = ".".join("default" if p == f"run_{run_id}" else p for p in k.split("."))
        assert key in loaded and loaded[key].shape == v.shape and torch.equal(loaded[key], v), k
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".final_checkpoint")]


def test_a_full_fine_tuning_run_leaves_its_model_to_end_and_export(trained):
    exp, _ = trained
    assert "adapter_config.json" not in exp.completed_with[3]
    assert not (exp.final_checkpoint_path(3) / "adapter_config.json").exists()


def test_the_final_checkpoint_is_replaced_whole_when_the_run_completes_again(trained):
    """A run that completes again (resumed, retrained after a crash) has its folder made aside
    and renamed over the old one: trainer_state.json stays beside the adapter meanwhile."""
    from rapidfire_nb.engine.export import write_final_checkpoint

    exp, _ = trained
    final = exp.final_checkpoint_path(1)
    state = (final / "trainer_state.json").read_bytes()
    (final / "adapter_model.safetensors").write_bytes(b"stale")
    rec = exp.engine.snapshot()[1]
    before = torch.get_rng_state()
    assert write_final_checkpoint(exp.store, rec) == final
    # it runs beside training runs: it must not draw from their random stream
    assert torch.equal(torch.get_rng_state(), before)
    assert (final / "trainer_state.json").read_bytes() == state
    from safetensors.torch import load_file

    assert load_file(str(final / "adapter_model.safetensors"))
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".final_checkpoint")]


def test_a_planted_trainer_state_is_not_copied_whole_when_the_run_completes_again(trained, monkeypatch):
    """A sparse trainer_state.json of terabytes planted in a shared folder costs no disk; copied
    beside the new adapter it was written out whole, filling the disk the runs' checkpoints
    need. It is read as a metadata file (bounded; the test lowers the bound) and left out."""
    from rapidfire_nb.engine import fsio
    from rapidfire_nb.engine.export import write_final_checkpoint

    exp, _ = trained
    final = exp.final_checkpoint_path(2)
    state = final / "trainer_state.json"
    kept = state.read_bytes()
    monkeypatch.setattr(fsio, "MAX_JSON_BYTES", 1 << 20)
    state.unlink()
    with open(state, "wb") as f:
        f.truncate((1 << 20) + 1)
    try:
        assert write_final_checkpoint(exp.store, exp.engine.snapshot()[2]) == final
        assert (final / "adapter_model.safetensors").is_file()
        assert not state.exists()
    finally:
        state.write_bytes(kept)


def test_a_warm_clone_gets_its_own_final_checkpoint_when_it_completes(tmp_path):
    from helpers import on_chunk_done
    from peft import PeftModel

    train, evald = make_demo_datasets(16, 4)
    exp = Experiment("clone", experiment_path=tmp_path, tracking=[])
    ids = []
    on_chunk_done(exp, 1, 0, lambda: ids.append(exp.clone_modify(1, {"training_args.learning_rate": 5e-2},
                                                                 warm_start=True)))
    exp.run_fit(RFGridSearch(config(dict(r=4, target_modules=["q_proj"])), trainer_type="SFT"),
                tiny_create_model, train, evald, num_chunks=2)
    assert ids == [2] and set(exp.get_runs_info().status) == {"completed"}
    for rid in (1, 2):
        model, _ = tiny_create_model({"model_kwargs": {}})
        loaded = PeftModel.from_pretrained(model, str(exp.final_checkpoint_path(rid))).state_dict()
        for k, v in exp.engine.run_weights(rid).items():
            key = ".".join("default" if p == f"run_{rid}" else p for p in k.split("."))
            assert torch.equal(loaded[key], v), (rid, k)
    exp.end()
