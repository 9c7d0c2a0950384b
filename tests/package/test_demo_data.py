"""The offline stand-ins of ``rapidfire_nb.demo_data``, used as the docs offer them: in place of a
hub model whose ``model_kwargs`` say what ``from_pretrained`` usually gets."""

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model

# the model_kwargs of RapidFire AI's tutorials and of the community notebooks
USUAL = [
    ({"device_map": "auto", "torch_dtype": "auto", "use_cache": False}, torch.float32, False),
    ({"device_map": "auto", "dtype": "auto", "use_cache": False}, torch.float32, False),
    ({"device_map": "auto", "torch_dtype": torch.bfloat16}, torch.bfloat16, True),
    ({"device_map": None, "torch_dtype": "bfloat16", "use_cache": False}, torch.bfloat16, False),
    ({"load_in_4bit": False, "device_map": "auto", "torch_dtype": "float16"}, torch.float16, True),
    ({"device_map": {"": 0}, "attn_implementation": "sdpa", "low_cpu_mem_usage": True}, torch.float32, True),
]


@pytest.mark.parametrize("kwargs, dtype, use_cache", USUAL, ids=range(len(USUAL)))
def test_tiny_create_model_takes_the_usual_model_kwargs(kwargs, dtype, use_cache):
    model, tokenizer = tiny_create_model({"model_name": "Qwen/Qwen2.5-0.5B-Instruct", "model_kwargs": kwargs})
    assert model.dtype == dtype
    assert model.config.use_cache is use_cache
    assert model.device.type == "cpu"      # the engine places it, as it does a hub model
    assert tokenizer.pad_token_id is not None


def test_tiny_create_model_still_names_a_knob_that_means_nothing():
    with pytest.raises(TypeError, match="hiden_size"):
        tiny_create_model({"model_kwargs": {"hiden_size": 32}})
    with pytest.raises(TypeError, match="torch_dtype='float17'"):
        tiny_create_model({"model_kwargs": {"torch_dtype": "float17"}})


def test_run_fit_trains_the_stand_in_with_hub_model_kwargs(tmp_path, tiny_data):
    config = RFModelConfig(
        model_name="Qwen/Qwen2.5-0.5B-Instruct",
        model_kwargs={"device_map": "auto", "torch_dtype": "auto", "use_cache": False, "hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=1e-2, per_device_train_batch_size=8, num_train_epochs=1,
                                  max_length=64, bf16=False))
    exp = Experiment("standin", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, *tiny_data, num_chunks=2,
                sample_prompts=[], block=True)
    info = exp.get_runs_info()
    exp.end()
    assert list(info.status) == ["completed"], info[["run_id", "status", "error"]]
