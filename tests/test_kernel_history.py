"""Runs train whatever ran before them in the kernel (issue 15, item 6).

Users train a plain TRL baseline next to rapidfire in one notebook. TRL's configs default to
``bf16=True`` (CPU autocast with ``use_cpu=True``), and a plain ``SFTTrainer(...).train()`` leaves
accelerate's process-wide state set to bf16; before issue 15 every later run with another
precision failed with "AcceleratorState has already been initialized and cannot be changed".
"""

from __future__ import annotations

import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model


def config(bf16: bool):
    return RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=4,
                                  num_train_epochs=1, max_length=64, bf16=bf16))


def test_runs_train_after_a_plain_bf16_sft_trainer_and_mix_precisions(tmp_path):
    from trl import SFTConfig, SFTTrainer

    train, evald = make_demo_datasets(16, 4)
    ref = Experiment("before", experiment_path=tmp_path, tracking=[])
    ref.run_fit(RFGridSearch(config(False), trainer_type="SFT"), tiny_create_model, train, evald,
                num_chunks=2, seed=3)
    ref_weights = ref.engine.run_weights(1)
    ref.end()

    # a plain TRL baseline in the same process, with TRL's default precision
    model, tok = tiny_create_model({"model_kwargs": {}})
    args = SFTConfig(output_dir=str(tmp_path / "plain"), use_cpu=True, max_steps=1, report_to=[],
                     per_device_train_batch_size=4, max_length=64, save_strategy="no",
                     disable_tqdm=True)
    assert args.bf16, "TRL's default is bf16=True: the case this test is about"
    SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tok).train()

    exp = Experiment("after", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List([config(False), config(True)]), trainer_type="SFT"),
                tiny_create_model, train, evald, num_chunks=2, seed=3)
    info = exp.get_runs_info()
    assert list(info.status) == ["completed", "completed"], info.error.tolist()
    # the fp32 run is exactly the one trained before the baseline: history changed nothing
    w = exp.engine.run_weights(1)
    assert w.keys() == ref_weights.keys()
    for k, v in ref_weights.items():
        assert torch.equal(w[k], v), k
    exp.end()
