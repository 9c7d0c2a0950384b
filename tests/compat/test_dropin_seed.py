"""The code of the TRL docs' RapidFire AI page (shared/seeds/000_...txt) run as written, with only
``from rapidfireai`` changed to ``from rapidfire_nb`` and the hub swapped for local stand-ins
(tests/helpers.py): the model name maps to a folder, the datasets are built in code. The one
other change is the length of training (``max_steps``, ``max_completion_length``), cut to keep
the suite's CPU time small: the page's 4 x 128 steps took ~5 minutes on 2 shared cores."""

from __future__ import annotations

import re

import pytest

from helpers import customer_support_rows, hub, ultrafeedback_rows

pytestmark = pytest.mark.slow   # slow tier: trains the TRL docs' RapidFire page as written

SEED_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
MAX_STEPS = 32         # the page: 128 (4 epochs of its 128 rows); here one epoch, 4 chunks


@pytest.fixture(scope="module")
def HUB(tmp_path_factory):
    return hub(tmp_path_factory.mktemp("hub"), SEED_MODEL, "Qwen/Qwen2.5-0.5B-Instruct")


def statuses(exp):
    return exp.get_runs_info().set_index("run_id").status.to_dict()


def test_seed_quick_start_sft(HUB, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # Experiment's default folder, as the seed leaves it
    calls = []
    # ---- the seed's code from here on (imports changed, loading swapped) ----
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFLoraConfig, RFSFTConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Load dataset
    dataset = {"train": customer_support_rows(160)}
    train_dataset = dataset["train"].select(range(128)).shuffle(seed=42)
    eval_dataset = dataset["train"].select(range(100, 124)).shuffle(seed=42)

    # Define data formatting function
    def formatting_function(row):
        calls.append(1)
        return {
            "prompt": [
                {"role": "system", "content": "You are a helpful customer support assistant."},
                {"role": "user", "content": row["instruction"]},
            ],
            "completion": [
                {"role": "assistant", "content": row["response"]}
            ]
        }

    # Initialize experiment
    experiment = Experiment(experiment_name="sft-customer-support")

    # Define multiple LoRA configurations to compare
    peft_configs = List([
        RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.1,
                     target_modules=["q_proj", "v_proj"], bias="none"),
        RFLoraConfig(r=32, lora_alpha=64, lora_dropout=0.1,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none")
    ])

    # Define multiple training configurations
    # 2 base configs × 2 PEFT configs = 4 total training runs
    config_set = List([
        RFModelConfig(
            model_name="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
            peft_config=peft_configs,
            training_args=RFSFTConfig(  # Wraps TRL's SFTConfig
                learning_rate=1e-3,
                per_device_train_batch_size=4,
                max_steps=MAX_STEPS,
                fp16=True,
            ),
            model_type="causal_lm",
            model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False},
            formatting_func=formatting_function,
        ),
        RFModelConfig(
            model_name="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
            peft_config=peft_configs,
            training_args=RFSFTConfig(
                learning_rate=1e-4,  # Different learning rate
                per_device_train_batch_size=4,
                max_steps=MAX_STEPS,
                fp16=True,
            ),
            model_type="causal_lm",
            model_kwargs={"device_map": "auto", "dtype": "auto", "use_cache": False},
            formatting_func=formatting_function,
        )
    ])

    # Define model creation function
    def create_model(model_config):
        model = AutoModelForCausalLM.from_pretrained(
            HUB[model_config["model_name"]],
            **model_config["model_kwargs"]
        )
        tokenizer = AutoTokenizer.from_pretrained(HUB[model_config["model_name"]])
        return (model, tokenizer)

    # Create grid search over all configurations
    config_group = RFGridSearch(configs=config_set, trainer_type="SFT")

    # Run all 4 configurations concurrently with chunk-based scheduling
    experiment.run_fit(config_group, create_model, train_dataset, eval_dataset,
                       num_chunks=4, seed=42)

    # End experiment
    experiment.end()
    # ---- end of the seed's code ----
    assert statuses(experiment) == {1: "completed", 2: "completed", 3: "completed", 4: "completed"}
    info = experiment.get_runs_info()
    assert (info.completed_steps == MAX_STEPS).all()
    res = experiment.get_results()
    for rid in (1, 2, 3, 4):
        ev = res[(res.run_id == rid) & (res.metric == "eval_loss")]
        assert sorted(set(ev.chunk)) == [0, 1, 2, 3]
    # the row mapper ran once per row of each dataset (plus one probe of the first row each):
    # the four runs share the mapped data
    assert len(calls) <= len(train_dataset) + len(eval_dataset) + 4


def test_seed_trainer_snippets_and_search_groups(HUB, tmp_path):
    """The seed's DPO and GRPO config snippets, its reward functions and RFRandomSearch(...,
    num_samples=...), each completed into a run_fit the way the page describes."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import (List, Range, RFDPOConfig, RFGridSearch, RFGRPOConfig,
                                     RFLoraConfig, RFModelConfig, RFRandomSearch)
    from peft import TaskType
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def create_model(model_config):
        model = AutoModelForCausalLM.from_pretrained(HUB[model_config["model_name"]],
                                                     **model_config["model_kwargs"])
        return model, AutoTokenizer.from_pretrained(HUB[model_config["model_name"]])

    lora_config = RFLoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=64,
        lora_alpha=64,
        lora_dropout=0.1,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        bias="none"
    )
    # -- DPO, random search as the page writes it --------------------------------------------
    config_list = List([RFModelConfig(
        model_name=SEED_MODEL, peft_config=lora_config,
        training_args=RFDPOConfig(
            beta=0.1,
            loss_type="sigmoid",
            max_length=1024,
            learning_rate=Range(1e-5, 5e-4, log=True),
            per_device_train_batch_size=8,
        ))])
    config_group = RFRandomSearch(configs=config_list, trainer_type="DPO", num_samples=3)
    exp = Experiment("seed-dpo", experiment_path=tmp_path, tracking=[])
    exp.run_fit(config_group, create_model, ultrafeedback_rows(16), ultrafeedback_rows(8, seed=1),
                num_chunks=2, seed=42)
    exp.end()
    assert set(statuses(exp).values()) == {"completed"} and len(statuses(exp)) == 3

    # -- GRPO with the page's reward functions ------------------------------------------------
    def extract_answer(text):
        m = re.search(r"<answer>(.*?)</answer>", text, re.S)
        return m.group(1).strip() if m else None

    seen_answers = []

    def correctness_reward(prompts, completions, answer, **kwargs):
        """Reward for correct answers"""
        seen_answers.extend(answer)
        responses = [completion[0]['content'] for completion in completions]
        extracted = [extract_answer(r) for r in responses]
        return [2.0 if r == a else 0.0 for r, a in zip(extracted, answer)]

    def format_reward(completions, **kwargs):
        """Reward for proper formatting"""
        import re
        pattern = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
        responses = [completion[0]["content"] for completion in completions]
        matches = [re.match(pattern, r) for r in responses]
        return [0.5 if match else 0.0 for match in matches]

    from datasets import Dataset

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} plus 1?"}],
                                  "answer": str(a + 1)} for a in range(8)])
    config = RFModelConfig(
        model_name=SEED_MODEL, peft_config=lora_config,
        training_args=RFGRPOConfig(
            learning_rate=5e-6,
            num_generations=8,
            max_completion_length=16,  # the page: 256
            max_steps=2,
        ),
        reward_funcs=[correctness_reward, format_reward],
    )
    exp = Experiment("seed-grpo", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(configs=config, trainer_type="GRPO"), create_model, prompts, None,
                num_chunks=2, seed=42)
    exp.end()
    assert statuses(exp) == {1: "completed"}
    assert seen_answers and set(seen_answers) <= {str(a + 1) for a in range(8)}
