"""``rapidfire bench``: interleaved training through the engine against plain sequential TRL.

One invocation trains the same N LoRA configs (one shared base model; the configs differ only in
learning rate, so every run does the same arithmetic) twice, in the same process:

* **interleaved** -- ``Experiment.run_fit`` over an ``RFGridSearch``, C chunks per run;
* **sequential** -- one ``trl.SFTTrainer(...).train()`` per config, one after another, built from
  the very same TRL/PEFT config objects (``automl.build_training_args`` / ``build_lora_config``).

and reports, as medians over ``--repeats``:

* ``ratio``          interleaved wall time / sequential wall time;
* ``overhead``       the engine's time outside forward/backward/optimizer (``train_s``) and
                     evaluation (``eval_s``), over the interleaved wall time -- from the engine's
                     own per-chunk split (``Experiment.get_timeline()``);
* ``swap_ms``        the engine's measured time per swap (``swap_s`` of a chunk);
* ``first_all_frac`` time until every run has its first eval point (the first all-run comparison)
                     over the sequential total;
* memory: peak memory of an experiment with 1 LoRA run vs 8, each measured in a fresh subprocess
  (CPU: the process's RSS high-water mark; CUDA: ``torch.cuda.max_memory_allocated``).

Fairness rules, enforced here rather than left to the reader:

* both sides get the same steps, batch, sequence length, precision (the CPU preset runs fp32 on
  both sides: TRL's ``bf16=True`` default would otherwise mean CPU autocast), gradient
  checkpointing off on both sides, and the same base weights (a fresh copy per side, made outside
  the timed region; ``create_model`` itself is therefore not timed on either side);
* evaluation: by default **the same eval on both sides** -- the engine evaluates after every chunk,
  the sequential baseline runs TRL's ``evaluate()`` every ``steps_per_chunk`` steps on the same eval
  set (``eval_strategy="steps"``). ``--eval none`` drops evaluation from both sides; then "first
  all-run comparison" means "every run has finished its first chunk".
* the sequential side logs every step (``logging_steps=1``), like the engine, and saves nothing
  (``save_strategy="no"``); the engine writes its chunk-boundary checkpoints (they are what makes
  a killed kernel resumable). Their writing runs on a writer thread during the next chunk, so it
  shows in wall time only as what it takes from training; the engine thread's snapshot of the
  state, and any wait for the writer, count as engine overhead.
* repeats alternate which side goes first; one untimed warm-up of each side comes before them.
* both sides train in a worker thread (the engine's is its own; the baseline gets one): on an
  oversubscribed CPU, small torch ops were measured 2-6x costlier in the main thread.
* the engine side runs with no tracker (``--tracking`` adds one): trackers read the event log in
  their own thread and are not part of the engine.

The ``smoke`` preset is a seconds-long run for tests; its numbers mean nothing.

The package, bottom up: ``presets`` (what each side trains), ``runners`` (the two sides),
``memory`` (peak memory, in subprocesses), ``report`` (targets, the report), ``run`` (one bench),
``pruner`` (``--pruner``), ``workers`` (``--workers``: the kernel vs Ray workers), ``vs``
(``--vs optuna,ray-tune``: time to the winner beside Optuna + TRL and Ray Tune + TRL), ``cli``.
"""

from rapidfire_nb.bench.cli import _parser, main
from rapidfire_nb.bench.memory import MEM_PROBE_TAG, measure_memory, mem_probe
from rapidfire_nb.bench.presets import (LEARNING_RATES, PRESETS, Preset, _quiet, build_base,
                                        make_datasets, make_group, training_kwargs)
from rapidfire_nb.bench.pruner import (PRUNER_LRS, PRUNER_RANKS, PRUNER_TARGETS,
                                       format_pruner_report, make_pruner_group, run_pruner_bench,
                                       run_pruner_side)
from rapidfire_nb.bench.report import TARGETS, check_targets, format_report
from rapidfire_nb.bench.run import run_bench
from rapidfire_nb.bench.runners import rng_guard, run_interleaved, run_sequential
from rapidfire_nb.bench.vs import format_vs_report, run_vs_bench

__all__ = ["LEARNING_RATES", "MEM_PROBE_TAG", "PRESETS", "PRUNER_LRS", "PRUNER_RANKS",
           "PRUNER_TARGETS", "TARGETS", "Preset", "_parser", "_quiet", "build_base", "check_targets",
           "format_pruner_report", "format_report", "format_vs_report", "main", "make_datasets", "make_group",
           "make_pruner_group", "measure_memory", "mem_probe", "rng_guard", "run_bench",
           "run_interleaved", "run_pruner_bench", "run_pruner_side", "run_sequential", "run_vs_bench",
           "training_kwargs"]
