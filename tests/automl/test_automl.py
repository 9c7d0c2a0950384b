"""Config API: RF* wrappers validated against the installed TRL/PEFT, grid and random expansion into
RunSpecs, porting knobs, device normalization, and the clone helpers (apply_changes & co)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from rapidfire_nb.automl import policy as backend
from rapidfire_nb.automl import (
    List, Range, RapidFireConfigWarning, RFDPOConfig, RFGridSearch, RFGRPOConfig, RFLoraConfig,
    RFModelConfig, RFRandomSearch, RFSFTConfig, apply_changes, build_lora_config,
    build_training_args, editable_knobs, warm_start_conflicts,
)
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.errors import ConfigError

CPU_ONLY = backend.detect_machine().accelerator is None


def reward_len(completions, **kw):
    return [float(len(c)) for c in completions]


def reward_one(completions, **kw):
    return [1.0 for _ in completions]


def fmt(row):
    return row


def seed_example():
    return List([
        RFModelConfig(
            model_name="tiny-llama",
            peft_config=List([
                RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                RFLoraConfig(r=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            ]),
            training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4),
        )
        for lr in (1e-3, 1e-4)
    ])


# ---------------------------------------------------------------------------------------------
# Grid expansion

def test_seed_example_expands_to_four_runs_in_order():
    specs = RFGridSearch(seed_example(), trainer_type="SFT").expand()
    assert len(specs) == 4
    assert [(s.training_args["learning_rate"], s.peft_config["r"]) for s in specs] == [
        (1e-3, 8), (1e-3, 32), (1e-4, 8), (1e-4, 32)]
    assert all(isinstance(s, RunSpec) and s.trainer_type == "SFT" for s in specs)
    assert specs[1].knobs == {"training_args.learning_rate": 1e-3, "peft_config.r": 32,
                              "peft_config.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    # RunSpecs hold plain JSON kwargs, not TRL objects
    for s in specs:
        json.dumps(s.training_args), json.dumps(s.peft_config)
        assert s.training_args["per_device_train_batch_size"] == 4


def test_first_declared_axis_varies_slowest_and_plain_lists_are_one_value():
    cfg = RFModelConfig(
        model_name="m",
        peft_config=RFLoraConfig(r=List([4, 8]), target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-4]), num_train_epochs=List([1, 2])),
        model_kwargs={"attn_implementation": List(["eager", "sdpa"]), "extra": [1, 2]},
    )
    specs = RFGridSearch(cfg, "SFT").expand()
    assert len(specs) == 2 * 2 * 2 * 2
    order = [(s.peft_config["r"], s.training_args["learning_rate"], s.training_args["num_train_epochs"],
              s.model_kwargs["attn_implementation"]) for s in specs]
    assert order[:3] == [(4, 1e-3, 1, "eager"), (4, 1e-3, 1, "sdpa"), (4, 1e-3, 2, "eager")]
    assert order[-1] == (8, 1e-4, 2, "sdpa")
    assert all(s.model_kwargs["extra"] == [1, 2] for s in specs)         # plain list: one value
    assert all(s.peft_config["target_modules"] == ["q_proj", "v_proj"] for s in specs)
    assert set(specs[0].knobs) == {"peft_config.r", "training_args.learning_rate",
                                   "training_args.num_train_epochs", "model_kwargs.attn_implementation"}


def test_nested_lora_list_with_its_own_axes_sums_branches():
    peft = List([RFLoraConfig(r=List([4, 8, 16])), RFLoraConfig(r=32, lora_alpha=List([16, 64])), None])
    specs = RFGridSearch(RFModelConfig("m", peft_config=peft, training_args=RFSFTConfig()), "SFT").expand()
    assert len(specs) == 3 + 2 + 1
    assert specs[-1].peft_config is None
    assert [s.knobs["peft_config.r"] for s in specs] == [4, 8, 16, 32, 32, None]


def test_model_name_reward_funcs_and_callables_in_knobs():
    cfg = List([
        RFModelConfig("a", training_args=RFGRPOConfig(per_device_train_batch_size=4, num_generations=4),
                      reward_funcs=List([[reward_len], [reward_len, reward_one]]), formatting_func=fmt),
        RFModelConfig("b", training_args=RFGRPOConfig(per_device_train_batch_size=4, num_generations=4),
                      reward_funcs=[reward_len], formatting_func=fmt),
    ])
    specs = RFGridSearch(cfg, "GRPO").expand()
    assert [s.model_name for s in specs] == ["a", "a", "b"]
    assert [s.knobs["reward_funcs"] for s in specs] == [
        ["reward_len"], ["reward_len", "reward_one"], ["reward_len"]]
    assert specs[1].reward_funcs == [reward_len, reward_one]
    assert "formatting_func" not in specs[0].knobs          # same everywhere: not a knob
    assert specs[0].formatting_func is fmt


def test_single_run_has_no_knobs_and_training_args_default_to_trl():
    specs = RFGridSearch(RFModelConfig("m"), "SFT").expand()
    assert len(specs) == 1 and specs[0].knobs == {}
    assert isinstance(build_training_args(specs[0]).learning_rate, float)


def test_range_in_grid_is_refused_naming_the_knob():
    cfg = List([RFModelConfig("m", training_args=RFSFTConfig()),
                RFModelConfig("m", training_args=RFSFTConfig(learning_rate=Range(1e-5, 1e-3)))])
    with pytest.raises(ConfigError, match=r"configs\[1\]\.training_args\.learning_rate.*Range"):
        RFGridSearch(cfg, "SFT")


def test_group_shape_errors():
    with pytest.raises(ConfigError, match="trainer_type"):
        RFGridSearch(RFModelConfig("m"), trainer_type="PPO")
    with pytest.raises(ConfigError, match="RFDPOConfig.*RFSFTConfig"):
        RFGridSearch(RFModelConfig("m", training_args=RFDPOConfig()), trainer_type="SFT")
    with pytest.raises(ConfigError, match="plain list"):
        RFGridSearch([RFModelConfig("m")], trainer_type="SFT")
    with pytest.raises(ConfigError, match="reward_funcs is required"):
        RFGridSearch(RFModelConfig("m", training_args=RFGRPOConfig(num_generations=8)), "GRPO")
    with pytest.raises(ConfigError, match="plain list"):
        RFModelConfig("m", peft_config=[RFLoraConfig(r=8), RFLoraConfig(r=16)])
    with pytest.raises(ConfigError, match="inside a plain Python list"):
        RFModelConfig("m", model_kwargs={"x": [List([1, 2])]})
    with pytest.raises(ConfigError, match="Did you mean 'peft_config'"):
        RFModelConfig("m", peft_confg=RFLoraConfig())
    assert RFModelConfig("m", num_gpus=1).extra == {"num_gpus": 1}


# ---------------------------------------------------------------------------------------------
# Validation at construction, by the real TRL/PEFT classes

@pytest.mark.parametrize("cls,kwargs,knob", [
    (RFSFTConfig, {"learnin_rate": 1e-3}, "learnin_rate"),
    (RFSFTConfig, {"learning_rate": "3e-4"}, "learning_rate"),
    (RFSFTConfig, {"per_device_train_batch_size": -1}, "per_device_train_batch_size"),
    (RFSFTConfig, {"max_steps": 0}, "max_steps"),
    (RFSFTConfig, {"num_train_epochs": List([1, -2])}, "num_train_epochs"),
    (RFSFTConfig, {"lr_scheduler_type": "cosine_decay_forever"}, "lr_scheduler_type"),
    (RFSFTConfig, {"optim": "adamw_nope"}, "optim"),
    (RFSFTConfig, {"learning_rate": Range(-1.0, 1.0)}, "learning_rate"),
    (RFDPOConfig, {"beta": -0.1}, "beta"),
    (RFLoraConfig, {"r": 0}, "r"),
    (RFLoraConfig, {"lora_dropout": 1.5}, "lora_dropout"),
    (RFLoraConfig, {"target_modules": 5}, "target_modules"),
    (RFLoraConfig, {"bias": "sometimes"}, "bias"),
    (RFLoraConfig, {"task_type": "NOT_A_TASK"}, "task_type"),
])
def test_invalid_values_raise_naming_the_knob(cls, kwargs, knob):
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert knob in str(info.value)
    assert info.value.knob == knob


def test_unknown_knob_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown knob 'lora_alpah'.*Did you mean 'lora_alpha'"):
        RFLoraConfig(lora_alpah=16)
    with pytest.raises(ConfigError, match=r"unknown knob 'made_up_knob'"):
        RFSFTConfig(made_up_knob=1)


def test_every_keyword_of_the_installed_class_is_accepted():
    from trl import SFTConfig
    import dataclasses
    names = {f.name for f in dataclasses.fields(SFTConfig) if f.init}
    assert set(RFSFTConfig.knob_names()) == names
    cfg = RFSFTConfig(dataset_text_field="text", packing=False, max_length=64, seed=3,
                      gradient_checkpointing_kwargs={"use_reentrant": False})
    assert cfg.max_length == 64 and cfg.packing is False


def test_grpo_knobs_are_validated_as_combinations():
    # TRL 1.16: with batch 4, TRL's default num_generations=8 does not divide the generation batch,
    # but each value of the axis does.
    cfg = RFGRPOConfig(per_device_train_batch_size=4, num_generations=List([2, 4]))
    specs = RFGridSearch(RFModelConfig("m", training_args=cfg, reward_funcs=[reward_len]), "GRPO").expand()
    assert [s.training_args["num_generations"] for s in specs] == [2, 4]
    with pytest.raises(ConfigError) as info:
        RFGRPOConfig(per_device_train_batch_size=4)
    assert "per_device_train_batch_size" in str(info.value) and "num_generations=8" in str(info.value)
    with pytest.raises(ConfigError, match=r"num_generations=8.*combination|combination.*num_generations=8") as info:
        RFGRPOConfig(per_device_train_batch_size=4, num_generations=List([2, 8]), beta=List([0.0, 0.1]))
    assert "divisible" in str(info.value)


def test_group_validates_every_expanded_combination():
    # Each config alone is fine; the Range end is checked at construction and every draw at expand.
    group = RFRandomSearch(
        RFModelConfig("m", training_args=RFGRPOConfig(per_device_train_batch_size=6,
                                                      num_generations=Range(2, 3)),
                      reward_funcs=[reward_len]),
        "GRPO", num_runs=2, seed=0)
    assert sorted(s.training_args["num_generations"] for s in group.expand()) == [2, 3]


# ---------------------------------------------------------------------------------------------
# Devices

@pytest.mark.skipif(not CPU_ONLY, reason="measures the CPU-only normalization")
def test_cpu_machine_adds_use_cpu_and_runs_fp16_configs_in_cpu_precision():
    backend._NOTES_SHOWN.clear()     # another test may have been told already
    with pytest.warns(RapidFireConfigWarning, match=r"fp16=True needs a CUDA GPU"):
        cfg = RFSFTConfig(learning_rate=1e-3, fp16=True)     # written for a T4
    assert cfg.fp16 is True                                   # the config keeps what was written
    spec = RFGridSearch(RFModelConfig("m", training_args=cfg), "SFT").expand()[0]
    assert spec.training_args["use_cpu"] is True and spec.training_args["fp16"] is False
    args = build_training_args(spec)
    assert args.use_cpu is True and args.fp16 is False and args.bf16 is False     # fp32
    # TRL's default bf16 autocast is slower than fp32 on CPU: fp32 unless the user chose
    plain = RFGridSearch(RFModelConfig("m", training_args=RFSFTConfig()), "SFT").expand()[0]
    assert plain.training_args == {"use_cpu": True, "bf16": False}
    chosen = RFGridSearch(RFModelConfig("m", training_args=RFSFTConfig(bf16=True)), "SFT").expand()[0]
    assert chosen.training_args == {"bf16": True, "use_cpu": True}
    assert build_training_args(chosen).bf16 is True


@pytest.mark.skipif(not CPU_ONLY, reason="measures the CPU-only normalization")
def test_the_cpu_fallback_is_said_once_for_a_whole_grid_of_configs():
    backend._NOTES_SHOWN.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")       # Python's own once-per-line filter out of the way
        a = RFSFTConfig(learning_rate=1e-3, fp16=True)
        b = RFSFTConfig(learning_rate=1e-4, fp16=True)
        c = RFSFTConfig(learning_rate=List([1e-5, 1e-6]), fp16=True)
    said = [str(w.message) for w in caught if "fp16=True needs a CUDA GPU" in str(w.message)]
    assert len(said) == 1 and "every config with fp16=True" in said[0], said
    assert a.fp16 is b.fp16 is c.fp16 is True
    # a clone asking for fp16 is the same fact: not said again
    spec = RFGridSearch(RFModelConfig("m", training_args=RFSFTConfig()), "SFT").expand()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clone = apply_changes(spec, {"training_args.fp16": True})
    assert clone.training_args["fp16"] is False
    assert not [w for w in caught if "fp16=True needs a CUDA GPU" in str(w.message)]


def test_normalization_for_a_t4_and_a_bf16_gpu():
    t4 = backend.Machine("cuda", bf16=False, name="Tesla T4")
    kw, notes = backend.normalize_for_machine({"learning_rate": 1e-3}, t4, "RFSFTConfig")
    assert kw == {"learning_rate": 1e-3, "bf16": False, "fp16": True} and not notes
    kw, notes = backend.normalize_for_machine({"bf16": True}, t4, "RFSFTConfig")
    assert kw == {"bf16": False} and "Tesla T4" in notes[0] and "fp16=True" in notes[0]
    kw, notes = backend.normalize_for_machine({"fp16": True}, t4, "RFSFTConfig")
    assert kw == {"fp16": True} and not notes
    a100 = backend.Machine("cuda", bf16=True, name="A100")
    assert backend.normalize_for_machine({"bf16": True}, a100, "X") == ({"bf16": True}, [])
    cpu = backend.Machine(None, bf16=False, name="CPU")
    assert backend.normalize_for_machine({"use_cpu": False}, cpu, "X") == (
        {"use_cpu": False, "bf16": False}, [])
    assert backend.normalize_for_machine({}, cpu, "X") == ({"use_cpu": True, "bf16": False}, [])
    # on a GPU machine, use_cpu=True means CPU precision rules
    assert backend.normalize_for_machine({"use_cpu": True, "fp16": True}, a100, "X")[0] == {
        "use_cpu": True, "fp16": False, "bf16": False}


@pytest.mark.skipif(not CPU_ONLY, reason="CPU-only behaviour of TRL")
def test_bf16_without_use_cpu_on_a_cpu_machine_names_both_knobs():
    RFSFTConfig(use_cpu=False)                 # runs on the CPU anyway, in fp32
    with pytest.raises(ConfigError, match=r"knobs use_cpu=False, bf16=True rejected.*bf16/gpu"):
        RFSFTConfig(use_cpu=False, bf16=True)


# ---------------------------------------------------------------------------------------------
# Porting RapidFire AI code

def test_removed_dpo_and_grpo_knobs_warn_once_each_and_are_dropped():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dpo = RFDPOConfig(model_adapter_name="default", ref_adapter_name="reference",
                          force_use_ref_model=False, beta=List([0.1, 0.01]), max_prompt_length=512,
                          max_completion_length=512, max_length=1024)
    texts = [str(w.message) for w in caught if issubclass(w.category, RapidFireConfigWarning)]
    import trl
    for knob in ("model_adapter_name", "ref_adapter_name", "force_use_ref_model", "max_prompt_length",
                 "max_completion_length"):
        assert sum(f"'{knob}'" in t for t in texts) == 1, knob
    assert all(f"trl {trl.__version__}" in t for t in texts)
    assert dpo.to_dict() == {"beta": List([0.1, 0.01]), "max_length": 1024}
    with pytest.warns(RapidFireConfigWarning, match="'max_prompt_length'.*GRPO"):
        grpo = RFGRPOConfig(max_prompt_length=256, max_completion_length=256, num_generations=8,
                            per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert "max_prompt_length" not in grpo.to_dict() and grpo.max_completion_length == 256
    # copying and expanding do not warn again
    with warnings.catch_warnings():
        warnings.simplefilter("error", RapidFireConfigWarning)
        RFGridSearch(RFModelConfig("m", training_args=dpo.copy()), "DPO").expand()


def test_renamed_knobs_map_to_todays_equivalent():
    with pytest.warns(RapidFireConfigWarning, match="warmup_ratio.*mapped to warmup_steps=0.1"):
        cfg = RFSFTConfig(warmup_ratio=0.1, max_seq_length=128, evaluation_strategy="no")
    assert cfg.to_dict() == {"warmup_steps": 0.1, "max_length": 128, "eval_strategy": "no"}
    args = build_training_args(RFGridSearch(RFModelConfig("m", training_args=cfg), "SFT").expand()[0])
    assert args.get_warmup_steps(100) == 10           # a fraction of the total, as warmup_ratio was
    with pytest.warns(RapidFireConfigWarning, match="dropped because 'warmup_steps' is set"):
        assert RFSFTConfig(warmup_ratio=0.1, warmup_steps=5).to_dict() == {"warmup_steps": 5}


def test_rapidfire_grpo_tutorial_config_ports_unchanged():
    with pytest.warns(RapidFireConfigWarning):
        base = RFGRPOConfig(learning_rate=5e-6, warmup_ratio=0.1, weight_decay=0.1, max_grad_norm=0.1,
                            adam_beta1=0.9, adam_beta2=0.99, lr_scheduler_type="linear",
                            per_device_train_batch_size=4, gradient_accumulation_steps=2,
                            num_generations=8, optim="adamw_8bit", num_train_epochs=1,
                            max_prompt_length=256, max_completion_length=256, logging_steps=2, beta=0.0)
    second = base.copy()
    second.learning_rate = 1e-6
    lora = RFLoraConfig(r=16, lora_alpha=16, lora_dropout=0.05, bias="none",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"])
    group = RFGridSearch(List([
        RFModelConfig(model_name="Qwen/Qwen2.5-0.5B-Instruct", peft_config=lora, training_args=base,
                      formatting_func=fmt, reward_funcs=[reward_len, reward_one],
                      model_kwargs={"device_map": "auto", "torch_dtype": "float16", "use_cache": False},
                      tokenizer_kwargs={"model_max_length": 512, "padding_side": "right"}),
        RFModelConfig(model_name="meta-llama/Llama-3.2-1B-Instruct", peft_config=lora, training_args=second,
                      formatting_func=fmt, reward_funcs=[reward_len, reward_one]),
    ]), trainer_type="GRPO")
    specs = group.expand()
    assert [s.training_args["learning_rate"] for s in specs] == [5e-6, 1e-6]
    assert base.learning_rate == 5e-6                       # the copy is independent
    assert set(specs[0].knobs) >= {"model_name", "training_args.learning_rate"}
    if CPU_ONLY:    # bitsandbytes' GPU optimizer falls back, the config keeps what was written
        assert specs[0].training_args["optim"] == "adamw_torch" and base.optim == "adamw_8bit"
    assert specs[0].model_config()["tokenizer_kwargs"]["model_max_length"] == 512


def test_peft_task_type_enum_is_normalized_to_json():
    from peft import TaskType
    spec = RFGridSearch(RFModelConfig("m", peft_config=RFLoraConfig(task_type=TaskType.CAUSAL_LM, r=8)),
                        "SFT").expand()[0]
    assert spec.peft_config == {"task_type": "CAUSAL_LM", "r": 8}
    json.dumps(spec.config_dict())


# ---------------------------------------------------------------------------------------------
# copy, attribute assignment, repr

def test_copy_and_attribute_assignment_revalidate():
    base = RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    wide = base.copy()
    wide.r = 16
    assert base.r == 8 and wide.r == 16
    assert wide.lora_alpha == 8                               # unset knob reads PEFT's default
    with pytest.raises(ConfigError, match="'r' must be >= 1"):
        wide.r = -3
    assert wide.r == 16                                       # a refused assignment changes nothing
    with pytest.raises(ConfigError, match="unknown knob 'rank'"):
        wide.rank = 4
    with pytest.raises(AttributeError, match="Did you mean 'lora_alpha'"):
        _ = wide.lora_alph
    wide.r = List([4, 8])
    assert repr(wide) == "RFLoraConfig(r=List([4, 8]), target_modules=['q_proj', 'v_proj'])"
    del wide.r
    assert wide.to_dict() == {"target_modules": ["q_proj", "v_proj"]}
    grpo = RFGRPOConfig(per_device_train_batch_size=4, num_generations=4)
    with pytest.raises(ConfigError, match="num_generations"):
        grpo.num_generations = 8
    assert grpo.num_generations == 4


def test_copy_is_deep_for_mutable_values():
    base = RFSFTConfig(gradient_checkpointing_kwargs={"use_reentrant": False})
    other = base.copy()
    other.gradient_checkpointing_kwargs["use_reentrant"] = True
    assert base.gradient_checkpointing_kwargs == {"use_reentrant": False}
    model = RFModelConfig("m", training_args=base, model_kwargs={"a": 1})
    clone = model.copy()
    clone.training_args.learning_rate = 1e-5
    clone.model_kwargs["a"] = 2
    assert "learning_rate" not in base.to_dict() and model.model_kwargs == {"a": 1}
    with pytest.raises(ConfigError, match="must be an RFLoraConfig"):
        clone.peft_config = {"r": 8}
    with pytest.raises(ConfigError, match="no field 'trainig_args'"):
        clone.trainig_args = RFSFTConfig()


# ---------------------------------------------------------------------------------------------
# Random search

def _random_group(num_runs, seed, lr=None, **kw):
    lr = lr or Range(1e-5, 1e-2, log=True)
    cfg = RFModelConfig("m", peft_config=RFLoraConfig(r=List([4, 8, 16])),
                        training_args=RFSFTConfig(learning_rate=lr, **kw))
    return RFRandomSearch(cfg, "SFT", num_runs=num_runs, seed=seed)


def test_random_search_is_deterministic_and_distinct():
    a = [s.knobs for s in _random_group(12, seed=7).expand()]
    b = [s.knobs for s in _random_group(12, seed=7).expand()]
    c = [s.knobs for s in _random_group(12, seed=8).expand()]
    assert a == b and a != c and len(a) == 12
    keys = {json.dumps(k, sort_keys=True) for k in a}
    assert len(keys) == 12
    assert all(1e-5 <= k["training_args.learning_rate"] <= 1e-2 for k in a)


def test_log_range_spreads_over_decades():
    specs = _random_group(60, seed=1).expand()
    logs = [math.log10(s.training_args["learning_rate"]) for s in specs]
    # uniform in log10 over [-5, -2]: each decade gets a fair share, unlike a linear draw
    per_decade = [sum(lo <= x < lo + 1 for x in logs) for lo in (-5, -4, -3)]
    assert min(per_decade) >= 8, per_decade
    linear = _random_group(60, seed=1, lr=Range(1e-5, 1e-2)).expand()
    assert sum(s.training_args["learning_rate"] < 1e-3 for s in linear) < 15


def test_int_ranges_and_too_small_spaces():
    cfg = RFModelConfig("m", training_args=RFSFTConfig(per_device_train_batch_size=Range(1, 3),
                                                       learning_rate=List([1e-3, 1e-4])))
    specs = RFRandomSearch(cfg, "SFT", num_runs=6, seed=0).expand()      # the whole space
    assert sorted((s.training_args["per_device_train_batch_size"], s.training_args["learning_rate"])
                  for s in specs) == sorted((b, lr) for b in (1, 2, 3) for lr in (1e-3, 1e-4))
    assert all(isinstance(s.training_args["per_device_train_batch_size"], int) for s in specs)
    with pytest.raises(ConfigError, match="at most 6 distinct"):
        RFRandomSearch(cfg, "SFT", num_runs=7, seed=0)
    same = List([RFModelConfig("m", training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-3])))])
    with pytest.raises(ConfigError, match="only 1 distinct"):
        RFRandomSearch(same, "SFT", num_runs=2, seed=0).expand()
    with pytest.raises(ConfigError, match="num_runs"):
        RFRandomSearch(cfg, "SFT", num_runs=0)


def test_range_construction_errors():
    assert Range(1, 8).dtype == "int" and Range(1, 8.0).dtype == "float"
    assert Range(1, 8, dtype=float).start == 1.0
    with pytest.raises(ConfigError, match="needs bounds > 0"):
        Range(0.0, 1.0, log=True)
    with pytest.raises(ConfigError, match="greater than end"):
        Range(5, 1)
    with pytest.raises(ConfigError, match="integer bounds"):
        Range(0.5, 3, dtype="int")
    with pytest.raises(ConfigError, match="dtype"):
        Range(1, 2, dtype="complex")
    with pytest.raises(ConfigError, match="at least one value"):
        List([])
    with pytest.raises(ConfigError, match="expects a list"):
        List("abc")


# ---------------------------------------------------------------------------------------------
# Clone helpers

def _spec():
    return RFGridSearch(seed_example(), "SFT").expand()[0]


def test_apply_changes_nested_and_dotted():
    parent = _spec()
    a = apply_changes(parent, {"training_args": {"learning_rate": 5e-4}})
    b = apply_changes(parent, {"training_args.learning_rate": 5e-4})
    assert a.training_args == b.training_args and a.training_args["learning_rate"] == 5e-4
    assert a.knobs["training_args.learning_rate"] == 5e-4
    assert parent.training_args["learning_rate"] == 1e-3        # the parent is untouched
    c = apply_changes(parent, {"peft_config.r": 16, "peft_config.lora_dropout": 0.1,
                               "training_args.gradient_checkpointing_kwargs.use_reentrant": False})
    assert c.peft_config["r"] == 16 and c.knobs["peft_config.lora_dropout"] == 0.1
    assert c.training_args["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert c.formatting_func is parent.formatting_func
    assert build_lora_config(c).r == 16
    same = apply_changes(parent, {})                      # a plain clone
    assert same.config_dict() == parent.config_dict() and same is not parent
    assert apply_changes(parent, {"training_args": {}}).training_args == parent.training_args


@pytest.mark.parametrize("changes,needle", [
    ({"training_args.learning_rat": 1e-3}, "learning_rate"),
    ({"training_args.learning_rate": "fast"}, "learning_rate"),
    ({"training_args.per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"peft_config.r": -1}, "'r'"),
    ({"peft_config.target_modules": 7}, "target_modules"),
    ({"training_args.learning_rate": List([1e-3, 1e-4])}, "one run"),
    ({"training_args.learning_rate": float("nan")}, "JSON"),
    ({"training_args.callbacks": print}, "JSON"),
    ({"formatting_func": "x"}, "not an editable knob"),
    ({"training_args.lr_scheduler_type": "wobbly"}, "lr_scheduler_type"),
    ({"generation_config.max_new_token": 5}, "max_new_tokens"),
    (["training_args.learning_rate"], "must be a dict"),
])
def test_apply_changes_refuses_bad_input_naming_it(changes, needle):
    parent = _spec()
    before = json.dumps(parent.config_dict(), sort_keys=True)
    with pytest.raises(ConfigError) as info:
        apply_changes(parent, changes)
    assert needle in str(info.value)
    assert json.dumps(parent.config_dict(), sort_keys=True) == before


def test_apply_changes_refuses_removed_knobs_instead_of_silently_dropping():
    spec = RFGridSearch(RFModelConfig("m", training_args=RFDPOConfig()), "DPO").expand()[0]
    with pytest.raises(ConfigError, match="max_prompt_length no longer exists in trl"):
        apply_changes(spec, {"training_args.max_prompt_length": 128})


def test_apply_changes_grpo_combination_is_validated():
    spec = RFGridSearch(RFModelConfig("m", training_args=RFGRPOConfig(per_device_train_batch_size=4,
                                                                      num_generations=4),
                                      reward_funcs=[reward_len]), "GRPO").expand()[0]
    with pytest.raises(ConfigError, match="num_generations"):
        apply_changes(spec, {"training_args.num_generations": 8})
    ok = apply_changes(spec, {"training_args": {"num_generations": 8, "per_device_train_batch_size": 8}})
    assert ok.reward_funcs == [reward_len] and ok.training_args["num_generations"] == 8


def test_editable_knobs_lists_set_and_common_knobs():
    knobs = editable_knobs(_spec())
    assert knobs["training_args.learning_rate"] == 1e-3
    assert knobs["peft_config.r"] == 8
    assert knobs["peft_config.target_modules"] == ["q_proj", "v_proj"]
    assert knobs["training_args.lr_scheduler_type"] == "linear"       # TRL's default, as a string
    assert "training_args.num_train_epochs" in knobs
    json.dumps(knobs)
    # everything listed is accepted back as a change
    child = apply_changes(_spec(), dict(knobs))
    assert child.training_args["learning_rate"] == 1e-3


def test_build_helpers_and_warm_start_conflicts():
    specs = RFGridSearch(seed_example(), "SFT").expand()
    args = build_training_args(specs[0], output_dir="/tmp/rf-run-1", report_to=[])
    assert args.output_dir == "/tmp/rf-run-1" and args.learning_rate == 1e-3
    with pytest.raises(ConfigError, match="unknown knob 'outptu_dir'"):
        build_training_args(specs[0], outptu_dir="x")
    lora = build_lora_config(specs[0])
    assert lora.r == 8 and set(lora.target_modules) == {"q_proj", "v_proj"}
    assert str(lora.task_type.value if hasattr(lora.task_type, "value") else lora.task_type) == "CAUSAL_LM"
    assert warm_start_conflicts(specs[0], specs[2]) == []            # only the learning rate differs
    reasons = warm_start_conflicts(specs[0], specs[1])
    assert any("r changes" in r for r in reasons) and any("target_modules" in r for r in reasons)
    assert warm_start_conflicts(specs[0], apply_changes(specs[0], {"model_name": "other"}))
    assert warm_start_conflicts(specs[0], apply_changes(specs[0], {"peft_config.lora_dropout": 0.2})) == []


def test_lists_of_training_configs_and_model_names_are_axes_too():
    cfg = RFModelConfig(model_name=List(["a", "b"]),
                        training_args=List([RFSFTConfig(learning_rate=1e-3),
                                            RFSFTConfig(learning_rate=List([1e-4, 1e-5]))]))
    specs = RFGridSearch(cfg, "SFT").expand()
    assert [(s.model_name, s.training_args["learning_rate"]) for s in specs] == [
        ("a", 1e-3), ("a", 1e-4), ("a", 1e-5), ("b", 1e-3), ("b", 1e-4), ("b", 1e-5)]
    assert specs[0].base_key() != specs[3].base_key()
    with pytest.raises(ConfigError, match="RFDPOConfig"):
        RFGridSearch(RFModelConfig("m", training_args=List([RFSFTConfig(), RFDPOConfig()])), "SFT")


def test_int_log_range_reaches_both_ends_and_stays_inside():
    import random
    r = Range(1, 64, log=True)
    rng = random.Random(0)
    draws = [r.sample(rng) for _ in range(3000)]
    assert min(draws) == 1 and max(draws) == 64 and all(isinstance(d, int) for d in draws)
    assert sum(d <= 8 for d in draws) > 2 * sum(d > 32 for d in draws)    # log-weighted (linear: 1/4)


# -- hints that point at the fix (newcomer review #13) -------------------------------------------

def test_a_plain_list_as_a_knob_value_suggests_a_grid_axis():
    with pytest.raises(ConfigError, match=r"expects float, got list .*wrap them in List\(\[0\.001, 0\.0001\]\)"):
        RFSFTConfig(learning_rate=[1e-3, 1e-4])
    # a list where the knob takes a list is a value, and no hint is given
    assert RFLoraConfig(target_modules=["q_proj", "v_proj"]).target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize("cls, alias, knob", [(RFSFTConfig, "lr", "learning_rate"),
                                              (RFSFTConfig, "epochs", "num_train_epochs"),
                                              (RFLoraConfig, "rank", "r")])
def test_short_knob_names_get_the_real_name_suggested(cls, alias, knob):
    with pytest.raises(ConfigError, match=rf"unknown knob '{alias}'.*Did you mean '{knob}'\?"):
        cls(**{alias: 1})


@pytest.mark.parametrize("key, dotted", [("learning_rate", "training_args.learning_rate"),
                                         ("lr", "training_args.learning_rate"),
                                         ("r", "peft_config.r"),
                                         ("rank", "peft_config.r")])
def test_clone_changes_with_a_short_knob_name_suggest_the_dotted_one(key, dotted):
    from rapidfire_nb.automl import apply_changes

    spec = RFGridSearch(RFModelConfig(model_name="m", peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
                                      training_args=RFSFTConfig(learning_rate=1e-3)),
                        trainer_type="SFT").expand()[0]
    with pytest.raises(ConfigError, match=rf"'{key}' is not an editable knob .*Did you mean '{dotted}'\?"):
        apply_changes(spec, {key: 5e-4 if key != "rank" and key != "r" else 8})
