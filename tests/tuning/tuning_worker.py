"""Subprocess side of the RFOptuna resume test (tests/tuning/test_tuning.py).

``python tuning_worker.py ROOT fresh|resume KILL_AFTER``: trains (or resumes) a small RFOptuna
experiment in ROOT; with KILL_AFTER > 0 the process SIGKILLs itself once that many chunks are
logged. KILL_AFTER = -2 SIGKILLs right after the study's ask() of the first refill. KILL_AFTER = -1 slows every checkpoint write and SIGKILLs at the first pruning decision on a run
whose checkpoint is still being written: between a decision and the durable checkpoint of the
chunk that reached its rung. At the end it prints one JSON line: the runs (status, knobs, pruning note) and the
study's trials (state, params, intermediate values), which the test compares.
"""

import json
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RF_TENSORBOARD_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_group():
    from rapidfire_nb.automl import (
        List,
        Range,
        RFLoraConfig,
        RFModelConfig,
        RFOptuna,
        RFSFTConfig,
    )

    cfg = RFModelConfig(
        model_name="tiny",
        peft_config=RFLoraConfig(r=List([4, 8]), target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=Range(1e-4, 5e-2, log=True), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64))
    return RFOptuna(cfg, trainer_type="SFT", n_initial=3, budget=6, pruner="sha", seed=5)


def summary(exp, group):
    info = exp.get_runs_info()
    runs = [{"run_id": int(r.run_id), "status": r.status, "chunks_done": int(r.chunks_done),
             "pruning": r.pruning if isinstance(r.pruning, str) else None,
             "knobs": exp.engine.snapshot()[int(r.run_id)].spec.knobs} for r in info.itertuples()]
    trials = [{"number": t.number, "state": t.state.name, "params": t.params,
               "intermediate": {str(k): v for k, v in sorted(t.intermediate_values.items())},
               "run_id": t.user_attrs.get("run_id")} for t in group._study.trials]
    return {"runs": runs, "trials": trials}


def main():
    root, mode, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from rapidfire_nb import Experiment
    from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

    train, evald = make_demo_datasets(32, 8)
    group = make_group()
    exp = Experiment("optuna", experiment_path=root, resume=(mode == "resume"))
    if kill_after == -1:
        import time

        from rapidfire_nb.engine.store import ExperimentStore
        from rapidfire_nb.tuning import ChunkAutoML

        # fault injection: a slow disk, so the checkpoint of the chunk that completes a rung is
        # still being written when the pruner decides on it
        write = ExperimentStore.save_checkpoint

        def slow_write(self, run_id, state):
            time.sleep(1.0)
            return write(self, run_id, state)

        ExperimentStore.save_checkpoint = slow_write
        save = ChunkAutoML.save

        def save_then_die(self):
            save(self)
            writer = exp.engine.persistence.writer
            if any(writer.pending(rid) for rid in self.pruned):
                os.kill(os.getpid(), signal.SIGKILL)

        ChunkAutoML.save = save_then_die
    elif kill_after == -2:
        # killed between the study's ask() of the first refill and anything logged about it
        import optuna

        ask = optuna.study.Study.ask

        def ask_then_die(self, *args, **kwargs):
            trial = ask(self, *args, **kwargs)
            if trial.number >= group.n_initial:
                os.kill(os.getpid(), signal.SIGKILL)
            return trial

        optuna.study.Study.ask = ask_then_die
    elif kill_after:
        seen = []

        def listener(ev):
            if ev["type"] == "chunk_done":
                seen.append(ev)
                if len(seen) >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

        exp.events.subscribe(listener)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, seed=3)
    print(json.dumps(summary(exp, group)), flush=True)
    exp.end()


if __name__ == "__main__":
    main()
