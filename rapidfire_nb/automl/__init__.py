"""The config API: search axes, RF* config wrappers and search groups that expand into RunSpecs.

Names and shapes follow RapidFire AI, so its tutorials port by changing one import::

    from rapidfire_nb.automl import List, RFModelConfig, RFLoraConfig, RFSFTConfig, RFGridSearch

    configs = List([
        RFModelConfig(
            model_name="Qwen/Qwen2.5-0.5B-Instruct",
            peft_config=List([
                RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                RFLoraConfig(r=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            ]),
            training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4),
        )
        for lr in (1e-3, 1e-4)
    ])
    group = RFGridSearch(configs, trainer_type="SFT")
    specs = group.expand()          # 4 RunSpecs, in a deterministic order

What lives here (public): ``List`` and ``Range`` (grid and random-search axes); ``RFLoraConfig``,
``RFSFTConfig``, ``RFDPOConfig``, ``RFGRPOConfig`` (every keyword of the installed PEFT/TRL class,
validated at construction by building the real object); ``RFModelConfig``; ``RFGridSearch``,
``RFRandomSearch`` and ``RFOptuna`` (Optuna's ask/tell over chunk-level eval values);
``RapidFireConfigWarning`` (the category of this package's warnings); and the helpers the engine
and ``clone_modify`` use on expanded runs: ``apply_changes``, ``check_changes``,
``flatten_changes``, ``editable_knobs``, ``build_training_args``, ``build_lora_config``,
``warm_start_conflicts``.

The package, by concern: ``axes`` (List, Range), ``configs`` (the RF* wrappers and RFModelConfig),
``groups`` (RFGridSearch, RFRandomSearch), ``optuna_search`` (RFOptuna), ``pruning`` (PruningOptions,
the ``pruner=`` knobs every group takes), ``specs`` (expanded leaves -> RunSpecs), ``edits`` (work
on expanded runs), ``policy`` (public: RapidFireConfigWarning, the removed-knob table, the device
policy below); ``_backend`` holds what it knows of the installed TRL/PEFT, ``_space`` the search
trees.

Devices: configs are validated as the engine will run them *on this machine*. Without a CUDA/MPS
accelerator, ``use_cpu=True`` is added unless you set ``use_cpu``, and the run is fp32 unless you
chose a precision (TRL's default bf16 autocast measured ~2x slower than fp32 on CPU); ``fp16=True``
on a CPU-only machine is accepted with a warning and run in fp32, because float16 autocast on CPU
is ~60x slower (measured with torch 2.13). On a CUDA GPU without bf16 (a T4, compute capability 7.5),
TRL's default bf16 becomes ``fp16=True`` and an explicit ``bf16=True`` falls back to fp32 with a
warning. A config written for a GPU
therefore always constructs on a laptop; on a GPU it runs as written.
"""


from __future__ import annotations

from rapidfire_nb.automl.axes import List, Range
from rapidfire_nb.automl.configs import RFDPOConfig, RFGRPOConfig, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.automl.edits import (
    apply_changes, build_lora_config, build_training_args, check_changes, editable_knobs, flatten_changes,
    warm_start_conflicts,
)
from rapidfire_nb.automl.groups import RFGridSearch, RFRandomSearch
from rapidfire_nb.automl.optuna_search import RFOptuna
from rapidfire_nb.automl.policy import RapidFireConfigWarning
from rapidfire_nb.automl.pruning import PruningOptions

__all__ = [
    "List", "Range", "RFLoraConfig", "RFSFTConfig", "RFDPOConfig", "RFGRPOConfig", "RFModelConfig",
    "RFGridSearch", "RFRandomSearch", "RFOptuna", "PruningOptions",
    "RapidFireConfigWarning", "apply_changes", "editable_knobs",
    "build_training_args", "build_lora_config", "warm_start_conflicts", "check_changes",
    "flatten_changes",
]

