"""FSDP: a run sharded over a gang of Ray workers (``num_gpus=k`` with ``fsdp`` training args).

The refusals need no Ray (they come before anything starts). The gang tests share one local Ray
(``ray.init(num_cpus=2, num_gpus=2)``: two declared GPUs the workers claim and train on as CPUs,
gloo between them) and as few gangs as possible: a gang start-up (two workers, their process
group) costs tens of seconds on this machine.
"""

from __future__ import annotations


import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.engine.sharding import fsdp2_settings, refusals
from rapidfire_nb.errors import ConfigError

FSDP = dict(fsdp="full_shard auto_wrap",
            fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                         "use_orig_params": True, "limit_all_gathers": True})


def lora(**kw):
    return RFLoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
                           "lora_dropout": 0.0, **kw})


def sft_args(batch=4, **kw):
    return RFSFTConfig(**{"learning_rate": 3e-2, "per_device_train_batch_size": batch,
                          "num_train_epochs": 1, "max_length": 64, "bf16": False,
                          "lr_scheduler_type": "linear", "warmup_steps": 1,
                          "per_device_eval_batch_size": 8, **kw})


def sharded_config(k=2, batch=4, peft="lora", **kw):
    return RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                         peft_config=lora() if peft == "lora" else peft,
                         training_args=sft_args(batch, **FSDP, **kw), num_gpus=k)


def folder_files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- (f) refusals, before anything trains --------------------------------------------------------

REFUSED = [
    ("k>1 without fsdp", dict(config=lambda: RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32}, peft_config=lora(),
        training_args=sft_args(), num_gpus=2), workers=2),
     r"run 1\): num_gpus=2 without FSDP settings"),
    ("run_fit's k>1 without fsdp", dict(config=lambda: RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32}, peft_config=lora(),
        training_args=sft_args()), workers=2, num_gpus=2),
     r"num_gpus=2 without FSDP settings"),
    ("fsdp without k>1", dict(config=lambda: sharded_config(k=1), workers=2),
     r"fsdp='full_shard auto_wrap' shards a run over several devices, but it asks for num_gpus=1"),
    ("fsdp in the kernel engine", dict(config=lambda: sharded_config(k=2), workers=0),
     r"needs a gang of 2 Ray workers, and this experiment trains in the kernel on one device"),
    ("more devices than workers", dict(config=lambda: sharded_config(k=3), workers=2),
     r"num_gpus=3 but the experiment has 2 Ray workers"),
    ("full fine-tuning", dict(config=lambda: sharded_config(k=2, peft=None), workers=2),
     r"full fine-tuning \(no peft_config\) is not sharded yet"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_in_run_fit_before_anything_trains(case, tmp_path):
    _, how, message = case
    train, evald = make_demo_datasets(16, 4)
    exp = Experiment("refused", experiment_path=tmp_path, num_workers=how["workers"])
    before = folder_files(exp.path)
    with pytest.raises(ConfigError, match=message):
        exp.run_fit(RFGridSearch(how["config"](), trainer_type="SFT"), tiny_create_model, train,
                    evald, num_chunks=2, num_gpus=how.get("num_gpus", 1), block=True)
    assert exp.engine is None
    assert folder_files(exp.path) == before
    import ray

    assert not ray.is_initialized()   # refused before Ray or any worker started


def test_refusals_name_each_config_of_a_grid():
    from rapidfire_nb.launch.arguments import expand as _expand

    group = RFGridSearch(List([sharded_config(k=2), sharded_config(k=1)]), trainer_type="SFT")
    specs = _expand(group)
    reasons = refusals(specs, workers=2)
    assert len(reasons) == 1 and reasons[0].startswith("config 2 (run 2): fsdp=")
    assert refusals(specs[:1], workers=2) == []
    assert "trains in the kernel" in refusals(specs[:1], workers=0)[0]


def test_fsdp1_knobs_map_onto_fsdp2_and_the_rest_are_named():
    settings, ignored = fsdp2_settings({
        "fsdp": "shard_grad_op auto_wrap offload",
        "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                        "use_orig_params": True, "limit_all_gathers": True,
                        "sync_module_states": True, "activation_checkpointing": True,
                        "xla": False, "min_num_params": 0}})
    assert settings == {"reshard_after_forward": False, "wrap": ["LlamaDecoderLayer"],
                        "auto_wrap": True, "activation_checkpointing": True, "offload": True}
    assert ignored == ["limit_all_gathers", "sync_module_states", "use_orig_params"]
    settings, ignored = fsdp2_settings({"fsdp": "full_shard", "fsdp_config": {"bogus_knob": 1}})
    assert settings["reshard_after_forward"] is True and ignored == ["bogus_knob"]
