"""RFModelConfig fields RapidFire tutorials use, through a real ``from_pretrained``: model_kwargs
with device_map/dtype "auto", tokenizer_kwargs, several base models in one grid, and a 4-bit
(bitsandbytes) base trained with LoRA."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from helpers import customer_support_rows, hub
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.errors import ConfigError

pytestmark = pytest.mark.slow   # slow tier: real from_pretrained bases, a 4-bit one too

MODELS = ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "Qwen/Qwen2.5-0.5B-Instruct")


@pytest.fixture(scope="module")
def HUB(tmp_path_factory):
    return hub(tmp_path_factory.mktemp("hub"), *MODELS)


def to_chat(row):
    return {"prompt": [{"role": "user", "content": row["instruction"]}],
            "completion": [{"role": "assistant", "content": row["response"]}]}


def loader(HUB, calls):
    def create_model(model_config):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        calls.append(model_config)
        path = HUB[model_config["model_name"]]
        model = AutoModelForCausalLM.from_pretrained(path, **model_config["model_kwargs"])
        return model, AutoTokenizer.from_pretrained(path, **model_config["tokenizer_kwargs"])
    return create_model


def sft(**kw):
    return RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=4, max_steps=4, **kw)


def test_two_base_models_in_one_grid_with_auto_kwargs(HUB, tmp_path):
    calls = []
    lora = RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    configs = List([
        RFModelConfig(model_name=name, peft_config=lora, training_args=sft(),
                      model_kwargs={"device_map": "auto", kind: "auto", "use_cache": False},
                      tokenizer_kwargs={"model_max_length": 256, "padding_side": "right", "truncation": True},
                      formatting_func=to_chat)
        for name, kind in zip(MODELS, ("dtype", "torch_dtype"))])
    exp = Experiment("two-bases", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(configs, trainer_type="SFT"), loader(HUB, calls), customer_support_rows(16),
                customer_support_rows(4, seed=1), num_chunks=2, seed=1)
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    # create_model once per distinct base, with the kwargs as written
    assert [c["model_name"] for c in calls] == list(MODELS)
    assert calls[0]["model_kwargs"] == {"device_map": "auto", "dtype": "auto", "use_cache": False}
    assert calls[1]["tokenizer_kwargs"]["model_max_length"] == 256
    assert len(exp.engine.factory.bases) == 2
    # each run trained an adapter on its own base: different bases, different starting losses
    res = exp.get_results()
    first = res[(res.metric == "loss") & (res.step == 1)].set_index("run_id").value
    assert first[1] != first[2]
    exp.end()


needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                               reason="bitsandbytes is not installed (pip install bitsandbytes)")


@needs_bnb
def test_lora_on_a_4bit_base(HUB, tmp_path):
    """The seed's memory section: quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...)
    in model_kwargs. The base is prepared for k-bit training and LoRA runs train on it."""
    from transformers import BitsAndBytesConfig

    bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16,
                                    bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4")
    model_kwargs = {"quantization_config": bnb_config, "device_map": "auto"}
    calls = []
    cfg = RFModelConfig(model_name=MODELS[0], model_kwargs=model_kwargs, formatting_func=to_chat,
                        peft_config=List([RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                                          RFLoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj"])]),
                        training_args=sft())
    exp = Experiment("qlora", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), loader(HUB, calls), customer_support_rows(16),
                customer_support_rows(4, seed=1), num_chunks=2, seed=1)
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    assert len(calls) == 1 and calls[0]["model_kwargs"]["quantization_config"] is not bnb_config
    base = next(iter(exp.engine.factory.bases.values())).model
    import bitsandbytes as bnb

    assert any(isinstance(m, bnb.nn.Linear4bit) for m in base.modules())
    res = exp.get_results()
    for rid in (1, 2):
        losses = res[(res.run_id == rid) & (res.metric == "loss")].value
        assert len(losses) == 4 and losses.notna().all()
        # gradients flow in every chunk, also after the chunk-end evaluations (bitsandbytes' CPU
        # inference packing would otherwise zero them from the second chunk on)
        norms = res[(res.run_id == rid) & (res.metric == "grad_norm")].value
        assert len(norms) == 4 and (norms > 0).all(), list(norms)
        w = exp.engine.run_weights(rid)
        assert w and any(float(v.abs().sum()) > 0 for k, v in w.items() if "lora_B" in k)
    exp.end()


@needs_bnb
def test_full_finetuning_of_a_4bit_base_is_refused(HUB, tmp_path):
    from transformers import BitsAndBytesConfig

    cfg = RFModelConfig(model_name=MODELS[0], formatting_func=to_chat, training_args=sft(),
                        model_kwargs={"quantization_config": BitsAndBytesConfig(load_in_4bit=True)})
    exp = Experiment("qfull", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match="loaded quantized.*give the runs on it a peft_config"):
        exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), loader(HUB, []), customer_support_rows(8), None,
                    num_chunks=1)
    assert exp.engine is None
    exp.end()
