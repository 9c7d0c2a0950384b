"""Helpers shared by the test files: import them from here (``from helpers import ...``), never
from another test file. A helper used by one file stays in that file.

- local stand-ins for the hub: a tiny Llama saved under a model name, so that
  ``AutoModelForCausalLM.from_pretrained(name, **model_kwargs)`` runs as RapidFire code runs it
  (``device_map="auto"``, ``dtype="auto"``, quantization configs), and small in-code datasets
  shaped like the ones RapidFire's tutorials and the TRL docs load;
- SFT configs in RapidFire's notebook style, the ops tests' LoRA group and event-log listener,
  DPO/GRPO arguments, the pruning grid and its suggestion readers;
- a recorded experiment (the events the controller writes) for the tracking and TensorBoard tests;
- the files of this checkout and the site folders of this interpreter, for the install tests.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from rapidfire_nb.automl import (List, RFDPOConfig, RFGridSearch, RFGRPOConfig, RFLoraConfig,
                                 RFModelConfig, RFSFTConfig)
from rapidfire_nb.demo_data import ANIMALS, WORDS, make_tiny_model_and_tokenizer
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.tracking import TrackerHub, metric_tag

ROOT = Path(__file__).resolve().parent.parent


# -- local stand-ins for the hub ----------------------------------------------------------------

_SAVED: dict[str, str] = {}


def local_model_dir(root, name: str, seed: int = 0, hidden_size: int = 64) -> str:
    """A tiny model and tokenizer saved on disk, standing in for the hub model ``name``
    (hidden size 64: bitsandbytes quantizes in blocks of 64 values)."""
    # keyed by the weights too: a test that saved a name with another seed must not hand its
    # weights to one that asks for distinct bases
    key = (name, seed, hidden_size)
    if key in _SAVED:
        return _SAVED[key]
    model, tok = make_tiny_model_and_tokenizer(hidden_size=hidden_size, seed=seed)
    path = root / f"{name.replace('/', '__')}-s{seed}-h{hidden_size}"
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    _SAVED[key] = str(path)
    return str(path)


def hub(root, *names: str) -> dict[str, str]:
    """{hub name: local folder}; each name gets its own weights (a different seed)."""
    return {n: local_model_dir(root, n, seed=i) for i, n in enumerate(names)}


def customer_support_rows(n: int, seed: int = 0):
    """Rows shaped like bitext/Bitext-customer-support-llm-chatbot-training-dataset."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        w = rng.choice(WORDS + ANIMALS)
        rows.append({"flags": "B", "instruction": f"I want to cancel order {w} {i}",
                     "category": "ORDER", "intent": "cancel_order",
                     "response": f"Order {w} is cancelled."})
    return Dataset.from_list(rows)


def ultrafeedback_rows(n: int, seed: int = 0):
    """Rows shaped like trl-lib/ultrafeedback_binarized: implicit prompt, conversational."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        w = rng.choice(WORDS + ANIMALS)
        user = {"role": "user", "content": f"Reverse the word: {w}"}
        rows.append({"chosen": [user, {"role": "assistant", "content": w[::-1]}],
                     "rejected": [user, {"role": "assistant", "content": w}],
                     "score_chosen": 8.0, "score_rejected": 3.0})
    return Dataset.from_list(rows)


def gsm8k_rows(n: int, seed: int = 0):
    """Rows shaped like openai/gsm8k 'main': a question and a worked answer ending in '#### N'."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": f"What is {a} plus {b}?",
                     "answer": f"{a} plus {b} makes {a + b}.\n#### {a + b}"})
    return Dataset.from_list(rows)


# -- SFT configs in RapidFire's notebook style ---------------------------------------------------

SFT_LORA = RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def sft(lr=1e-2, **kw):
    base = dict(learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1, max_length=64,
                lr_scheduler_type="linear")
    base.update(kw)
    return RFSFTConfig(**base)


def to_chat(row):
    return {"prompt": [{"role": "user", "content": row["instruction"]}],
            "completion": [{"role": "assistant", "content": row["response"]}]}


def model(training_args=None, **kw):
    kw.setdefault("peft_config", SFT_LORA)
    return RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                         training_args=training_args or sft(), **kw)


def own(weights):
    """Adapter weights keyed without the run's adapter name ("X"), to compare runs."""
    return {".".join("X" if i > 0 and p[i - 1] in ("lora_A", "lora_B") else x for i, x in enumerate(p)): v
            for k, v in weights.items() for p in [k.split(".")]}


def two_chat_runs():
    """Two SFT runs (lr 1e-2 and 1e-3) of the notebook-style model on chat rows (``to_chat``)."""
    return RFGridSearch(model(sft(List([1e-2, 1e-3])), formatting_func=to_chat), trainer_type="SFT")


# -- interactive ops: a LoRA group and ops at an exact chunk boundary ---------------------------

LR_A, LR_B = 3e-2, 1e-2


def ops_config(lr):
    return RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                                  max_length=64, bf16=False, lr_scheduler_type="linear"))


def ops_group(*lrs):
    return RFGridSearch(ops_config(List(list(lrs)) if len(lrs) > 1 else lrs[0]), trainer_type="SFT")


def on_chunk_done(exp, run_id, chunk, action):
    """Call ``action()`` in the engine thread once ``run_id`` has finished ``chunk`` (epoch 0).

    Returns a list that receives ``True`` when it fired, or the exception ``action`` raised
    (the event log swallows listener exceptions, so tests must look)."""
    fired: list = []

    def listener(ev):
        if (ev["type"] == "chunk_done" and ev["run_id"] == run_id and ev["epoch"] == 0
                and ev["chunk"] == chunk and not fired):
            fired.append(True)
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - surfaced by the test
                fired.append(exc)

    exp.events.subscribe(listener)
    return fired


def events_of(exp, type_, **match):
    """The experiment's events of one type whose fields equal ``match``."""
    return [e for e in exp.events.since(0)
            if e["type"] == type_ and all(e.get(k) == v for k, v in match.items())]


# -- DPO and GRPO ------------------------------------------------------------------------------

PREFERENCE_LORA = dict(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)


def dpo_args(lr, beta, **kw):
    base = dict(learning_rate=lr, beta=beta, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                num_train_epochs=1, bf16=False, max_length=48)
    base.update(kw)
    return RFDPOConfig(**base)


def short_answer(prompts, completions, **kw):
    return [-abs(len(c) - 2) / 4 for c in completions]


def grpo_args(lr, num_generations, **kw):
    base = dict(learning_rate=lr, num_generations=num_generations, per_device_train_batch_size=4,
                per_device_eval_batch_size=4, max_completion_length=4, num_train_epochs=1, bf16=False)
    base.update(kw)
    return RFGRPOConfig(**base)


# -- pruning: a grid of four learning rates and its suggestions ---------------------------------

PRUNING_LORA = dict(target_modules=["q_proj", "v_proj"])
PRUNING_LRS = (1e-4, 1e-3, 1e-2, 3e-2)


def pruning_grid(epochs=1, **kw):
    configs = List([
        RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, **PRUNING_LORA),
                      training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=bs,
                                                num_train_epochs=epochs, max_length=64))
        for lr, bs in zip(PRUNING_LRS, (8, 4, 8, 8))])
    return RFGridSearch(configs, trainer_type="SFT", **kw)


def wait_for_marks(exp, n, timeout=300):
    """The runs info rows of the runs the pruner marked, once there are at least ``n``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marked = exp.get_runs_info().dropna(subset=["pruning"])
        if len(marked) >= n:
            return marked
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} suggestions after {timeout} s")


def suggestion_answers(exp):
    """(op, run id, accepted) of every confirm/ignore answer to a pruning suggestion."""
    return [(ev["op"], ev["run_id"], ev["accepted"]) for ev in exp.events.since(0)
            if ev["type"] == "op" and ev["op"] in ("confirm_suggestion", "ignore_suggestion")]


# -- a recorded experiment, for the tracking backends ------------------------------------------

RECORDED_STEPS_PER_CHUNK = 4
RECORDED_BATCH = 4
RECORDED_NUM_CHUNKS = 3


def _recorded_config(lr: float) -> dict:
    return {
        "trainer_type": "SFT", "model_name": "tiny-llama", "model_type": "causal_lm",
        "model_kwargs": {}, "tokenizer_kwargs": {}, "ref_model_name": None,
        "training_args": {"learning_rate": lr, "per_device_train_batch_size": RECORDED_BATCH,
                          "use_cpu": True, "lr_scheduler_type": "linear"},
        "peft_config": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
        "generation_config": None, "formatting_func": None, "compute_metrics": "accuracy_fn",
    }


class Recorder:
    """Appends what the controller would, and keeps the points every backend must show."""

    def __init__(self, events: EventLog):
        self.events = events
        self.expected: dict[int, dict[str, list[tuple[int, float]]]] = {}
        self.samples: dict[int, int] = {}
        self.steps: dict[int, int] = {}

    def create(self, run_id, lr, parent=None, warm_start=False):
        base_samples = self.samples[parent] if (parent and warm_start) else 0
        base_step = self.steps[parent] if (parent and warm_start) else 0
        self.samples[run_id], self.steps[run_id] = base_samples, base_step
        self.expected[run_id] = {}
        self.events.append(
            "run_created", run_id=run_id, trainer_type="SFT", config=_recorded_config(lr),
            knobs={"training_args.learning_rate": lr}, parent_run_id=parent,
            warm_start=warm_start, total_steps=RECORDED_STEPS_PER_CHUNK * RECORDED_NUM_CHUNKS,
            steps_per_epoch=RECORDED_STEPS_PER_CHUNK * RECORDED_NUM_CHUNKS, num_chunks=RECORDED_NUM_CHUNKS,
            base_samples_seen=base_samples, base_step=base_step)
        self.status(run_id, "pending")

    def status(self, run_id, status, error=None, reason=None):
        self.events.append("run_status", run_id=run_id, status=status, error=error, reason=reason)

    def chunk(self, run_id, chunk, complete=False):
        batch = []
        for _ in range(RECORDED_STEPS_PER_CHUNK):
            self.steps[run_id] += 1
            self.samples[run_id] += RECORDED_BATCH
            g, s = self.steps[run_id], self.samples[run_id]
            metrics = {"loss": 3.0 / g + run_id / 100, "learning_rate": 1e-3 * (1 - g / 12),
                       "grad_norm": 0.5 + run_id + g / 10, "num_tokens": 40.0 * g}
            batch.append(("metric", dict(run_id=run_id, split="train", step=g, samples_seen=s,
                                         epoch=0, chunk=chunk, metrics=metrics)))
            self._expect(run_id, "train", s, {**metrics, "global_step": float(g)})
        g, s = self.steps[run_id], self.samples[run_id]
        eval_metrics = {"eval_loss": 2.5 / g + run_id / 50, "eval_accuracy": min(1.0, g / 12),
                        "eval_runtime": 0.01}
        batch.append(("metric", dict(run_id=run_id, split="eval", step=g, samples_seen=s,
                                     epoch=0, chunk=chunk, metrics=eval_metrics)))
        self._expect(run_id, "eval", s, eval_metrics)
        batch.append(("chunk_done", dict(run_id=run_id, epoch=0, chunk=chunk, device="cpu",
                                         start=0.0, end=1.0, train_s=0.5, eval_s=0.1, swap_s=0.1,
                                         other_s=0.0, completed_steps=g,
                                         total_steps=RECORDED_STEPS_PER_CHUNK * RECORDED_NUM_CHUNKS,
                                         samples_seen=s, chunks_done=chunk + 1)))
        self.events.extend(batch)
        if complete:
            self.status(run_id, "completed")

    def _expect(self, run_id, split, step, metrics):
        for name, value in metrics.items():
            tag = metric_tag(split, name) if name != "global_step" else "train/global_step"
            self.expected[run_id].setdefault(tag, []).append((step, float(value)))

    # The experiment, in two phases so that a resume can happen in between.
    def phase1(self):
        self.events.append("experiment", name="exp", path="", resumed=False)
        self.create(1, 1e-3)
        self.create(2, 1e-4)
        self.status(1, "running")
        self.chunk(1, 0)
        self.status(2, "running")
        self.chunk(2, 0)
        self.status(2, "stopped", reason="stopped by user")
        self.events.append("op", op="stop", run_id=2, accepted=True, reason=None, new_run_id=None)
        self.create(3, 5e-4, parent=1, warm_start=True)

    def phase2(self):
        self.create(4, 2e-4, parent=2, warm_start=False)
        self.create(5, 3e-4, parent=1, warm_start=False)
        self.status(5, "deleted", reason="deleted by user")
        self.chunk(1, 1)
        self.status(3, "running")
        self.chunk(3, 1)
        self.status(2, "pending", reason="resumed by user")
        self.status(2, "running")
        self.chunk(2, 1)
        self.status(2, "stopped", reason="stopped by user")
        self.status(4, "running")
        self.chunk(4, 0)
        self.status(4, "failed", error="Traceback (most recent call last):\nValueError: boom",
                    reason="ValueError: boom")
        self.chunk(1, 2, complete=True)
        self.chunk(3, 2, complete=True)
        self.events.append("experiment_end")

    def record_all(self):
        self.phase1()
        self.phase2()
        return self


def track_recorded(exp_path: Path, names, name="exp") -> tuple[Recorder, TrackerHub]:
    """The recorded experiment written to ``exp_path``'s event log with the trackers ``names``."""
    events = EventLog(exp_path / "events.jsonl")
    hub = TrackerHub(events, exp_path, name, names).start()
    rec = Recorder(events).record_all()
    assert hub.flush(120), hub.failures
    hub.close()
    return rec, hub


def trackio_state(exp_path: Path) -> dict:
    return json.loads((exp_path / "tracking" / "trackio.json").read_text())["state"]


def trackio_points(exp_path: Path, run_id: int, name: str | None = None) -> dict:
    from trackio.sqlite_storage import SQLiteStorage

    state = trackio_state(exp_path)
    uid = trackio_uid(exp_path, run_id, name)
    out: dict[str, list] = {}
    for row in SQLiteStorage.get_logs(state["project"], run_id=uid):
        for key, value in row.items():
            if key in ("step", "timestamp"):
                continue
            out.setdefault(key, []).append((row["step"], value))
    return out


def logged_run_name(exp_path: Path, run_id: int) -> str:
    """Run ``run_id``'s short name (``3 · lr 1e-3``) from the knobs its run_created event logged."""
    from rapidfire_nb.engine.events import read_events
    from rapidfire_nb.tracking.naming import short_name

    for ev in read_events(exp_path / "events.jsonl"):
        if ev.get("type") == "run_created" and ev.get("run_id") == run_id:
            return short_name(run_id, ev.get("knobs"))
    raise AssertionError(f"no run_created for run {run_id} in {exp_path}")


def trackio_uid(exp_path: Path, run_id: int, name: str | None = None) -> str:
    """The id the Trackio tracker gives run ``run_id`` (or the run named ``name``) of this folder."""
    digest = hashlib.sha1(str(exp_path.resolve()).encode()).hexdigest()
    return f"rf-{digest[:10]}-{name or logged_run_name(exp_path, run_id)}"


# -- this checkout and this interpreter, for the install tests ---------------------------------

def source_files() -> list[str]:
    """The checkout's files git knows about (tracked, or new and not ignored): what a clone has."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def site_dirs() -> list[str]:
    """Where this interpreter finds its packages (its venv's and, if it has them, the base's)."""
    dirs = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths()[key]
        if p not in dirs and Path(p).is_dir():
            dirs.append(p)
    return dirs
