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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

TARGETS = {"ratio": 1.03, "overhead": 0.03, "memory_ratio": 1.15, "first_all_slack": 0.05}
LEARNING_RATES = [1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6]
MEM_PROBE_TAG = "RFBENCH_MEM "


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None           # None: the demo tokenizer's vocabulary
    dtype: str                  # "float32" | "bfloat16"
    device: str                 # "cpu" | "cuda"
    batch: int
    seq_len: int | None         # None: the short demo prompt/completion data, padded per batch
    steps_per_chunk: int
    num_chunks: int
    n_configs: int
    lora_r: int
    lora_targets: tuple[str, ...]
    n_eval: int

    @property
    def steps_per_run(self) -> int:
        return self.steps_per_chunk * self.num_chunks

    @property
    def n_train(self) -> int:
        # one epoch is exactly num_chunks chunks of steps_per_chunk optimizer steps
        return self.steps_per_run * self.batch


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        name="cpu", description="Llama architecture, ~4.5M params (hidden 256, 4 layers), fp32, CPU",
        hidden=256, layers=4, heads=4, kv_heads=4, intermediate=1024, vocab=None, dtype="float32",
        device="cpu", batch=8, seq_len=None, steps_per_chunk=8, num_chunks=4, n_configs=4,
        lora_r=8, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=32),
    "tinyllama": Preset(
        name="tinyllama", description="TinyLlama-1.1B-shaped (hidden 2048, 22 layers, GQA 32/4, "
                                      "vocab 32000), random init, bf16, CUDA",
        hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000,
        dtype="bfloat16", device="cuda", batch=4, seq_len=512, steps_per_chunk=8, num_chunks=8,
        n_configs=4, lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=16),
    "smoke": Preset(
        name="smoke", description="seconds-long run of the bench machinery (numbers mean nothing)",
        hidden=32, layers=2, heads=4, kv_heads=4, intermediate=64, vocab=None, dtype="float32",
        device="cpu", batch=4, seq_len=None, steps_per_chunk=2, num_chunks=2, n_configs=2,
        lora_r=4, lora_targets=("q_proj", "v_proj"), n_eval=8),
}


# ----------------------------------------------------------------------------------------------
# Building blocks: base model, data, config group


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_base(p: Preset):
    """The shared base model (random init, seeded) on the preset's device, and its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapidfire_nb import demo_data

    tok = demo_data.make_tokenizer()
    if p.seq_len:
        tok.model_max_length = max(tok.model_max_length, p.seq_len)
    config = LlamaConfig(
        vocab_size=p.vocab or len(tok), hidden_size=p.hidden, intermediate_size=p.intermediate,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        max_position_embeddings=max(512, p.seq_len or 0), pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    saved = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        # build directly on the device in the target dtype: a 1.1B fp32 CPU init takes minutes
        with torch.device(p.device):
            model = LlamaForCausalLM(config).to(_torch_dtype(p.dtype))
    finally:
        torch.random.set_rng_state(saved)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def make_datasets(p: Preset, n_train: int | None = None):
    """Train/eval sets sized so one epoch is exactly ``num_chunks`` chunks of the preset."""
    import random

    from datasets import Dataset

    from rapidfire_nb import demo_data

    n_train = n_train or p.n_train
    if p.seq_len is None:
        return demo_data.make_demo_datasets(n_train, p.n_eval, seed=0)
    words = demo_data.WORDS + demo_data.ANIMALS + demo_data.COLORS
    rng = random.Random(0)

    def rows(n):
        # ~2 tokens per word: 400 words always exceed seq_len tokens, so truncation makes every
        # sequence exactly seq_len long (a fixed batch shape, as in the "4 x 512 tokens")
        return [{"text": " ".join(rng.choice(words) for _ in range(p.seq_len))} for _ in range(n)]

    return Dataset.from_list(rows(n_train)), Dataset.from_list(rows(p.n_eval))


def training_kwargs(p: Preset) -> dict:
    kw = dict(per_device_train_batch_size=p.batch, per_device_eval_batch_size=p.batch,
              gradient_accumulation_steps=1, num_train_epochs=1, lr_scheduler_type="linear",
              warmup_steps=0, gradient_checkpointing=False, dataloader_num_workers=0,
              bf16=p.dtype == "bfloat16", fp16=p.dtype == "float16")
    if p.device == "cpu":
        kw["use_cpu"] = True
    if p.seq_len:
        kw["max_length"] = p.seq_len
    return kw


def make_group(p: Preset, n_configs: int):
    """N LoRA configs on one base, differing only in learning rate (identical compute per run)."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    if not 1 <= n_configs <= len(LEARNING_RATES):
        raise ValueError(f"--configs must be between 1 and {len(LEARNING_RATES)}, got {n_configs}")
    lrs = LEARNING_RATES[:n_configs]
    lr = List(lrs) if n_configs > 1 else lrs[0]
    cfg = RFModelConfig(
        model_name=f"bench-{p.name}",
        peft_config=RFLoraConfig(r=p.lora_r, lora_alpha=2 * p.lora_r, lora_dropout=0.0,
                                 target_modules=list(p.lora_targets)),
        training_args=RFSFTConfig(learning_rate=lr, **training_kwargs(p)))
    return RFGridSearch(cfg, trainer_type="SFT")


@contextlib.contextmanager
def _quiet():
    """Library progress bars and deprecation chatter off (the report is what the user reads)."""
    import datasets
    import transformers

    was_bar = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            if was_bar:
                datasets.enable_progress_bar()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# The two sides


def run_interleaved(p: Preset, group, base, train, evald, workdir: str, tracking=None,
                    offload: str = "auto") -> dict:
    """Train the group through the engine; timings from the engine's own per-chunk split."""
    from rapidfire_nb.experiment import Experiment

    model, tok = base
    exp = Experiment(f"bench-{int(time.time() * 1000)}", experiment_path=workdir,
                     tracking=list(tracking or []), offload=offload)
    try:
        _sync(p.device)
        t0, c0 = time.time(), time.process_time()
        exp.run_fit(group, lambda cfg: (model, tok), train, evald, num_chunks=p.num_chunks,
                    seed=42, block=True)
        _sync(p.device)
        wall, cpu = time.time() - t0, time.process_time() - c0
        info = exp.get_runs_info()
        failed = info[info["status"] != "completed"]
        if len(failed):
            errors = "; ".join(f"run {r.run_id}: {r.status} {str(r.error)[-400:]}"
                               for r in failed.itertuples())
            raise RuntimeError(f"interleaved side: not every run completed: {errors}")
        tl = exp.get_timeline()
        # when each run's first chunk ended (the timeline is the reducer's, engine/state.py)
        first_done = tl.groupby("run_id")["end"].min().to_dict() if len(tl) else {}
        steps = int(info["completed_steps"].sum())
        write_wait = float(exp.engine.write_wait_s)
    finally:
        exp.end()
    train_s, eval_s = float(tl["train_s"].sum()), float(tl["eval_s"].sum())
    setup_s, ckpt_s = float(tl["setup_s"].sum()), float(tl["checkpoint_s"].fillna(0).sum())
    snap_s = float(tl["snapshot_s"].fillna(0).sum())
    swap_s, other_s = float(tl["swap_s"].sum()), float(tl["other_s"].sum())
    in_chunks = float((tl["end"] - tl["start"]).sum())
    return {
        "wall_s": wall, "cpu_s": cpu, "steps": steps, "chunks": len(tl),
        "train_s": train_s, "eval_s": eval_s, "swap_s": swap_s, "setup_s": setup_s,
        # the engine thread only snapshots a run's state; the writer thread serialises, writes and
        # fsyncs it while the next chunk trains (checkpoint_s: the writer's time, not the engine's)
        "snapshot_s": snap_s,
        "checkpoint_s": ckpt_s,
        "write_wait_s": write_wait,
        # other_s includes setup and the snapshot; the rest is bookkeeping inside the chunk
        "chunk_misc_s": max(0.0, other_s - setup_s - snap_s),
        "outside_chunks_s": max(0.0, wall - in_chunks),
        "overhead_s": wall - train_s - eval_s,
        "overhead_frac": (wall - train_s - eval_s) / wall,
        # the same less the runs' set-up (TRL trainer construction with its dataset preparation,
        # PEFT adapter injection, optimizer creation), which sequential TRL pays too: what the
        # engine itself adds (swaps, snapshots, scheduling, log and runs.json writes, waits)
        "engine_added_frac": (wall - train_s - eval_s - setup_s) / wall,
        "setup_frac": setup_s / wall,
        "swap_ms_median": 1000 * float(tl["swap_s"].median()),
        "swap_ms_max": 1000 * float(tl["swap_s"].max()),
        "step_ms": 1000 * train_s / max(steps, 1),
        "first_all_s": max(first_done.values()) - t0 if first_done else math.nan,
    }


def _in_worker_thread(fn, *args, **kwargs):
    """Run ``fn`` in a fresh thread and return its result (re-raising its exception).

    The engine trains in a background thread. On an oversubscribed CPU (a shared 2-core machine
    with other work), the same small torch ops measured 2-6x more CPU time and ~3x more wall time
    in the main thread than in a worker thread (OpenMP spin-waiting); running the sequential
    baseline in a worker thread too keeps the comparison about the engine, not about threads.
    """
    import threading

    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    th = threading.Thread(target=target, name="bench-sequential")
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_sequential(p: Preset, specs, pristine, tok, train, evald, workdir: str, use_eval: bool,
                   main_thread: bool = False) -> dict:
    """Each config alone with plain ``SFTTrainer(...).train()``, one after the other (in a worker
    thread like the engine's, unless ``main_thread``)."""
    if not main_thread:
        return _in_worker_thread(run_sequential, p, specs, pristine, tok, train, evald, workdir,
                                 use_eval, main_thread=True)
    import torch
    from peft import get_peft_model
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    from rapidfire_nb import automl

    class Marks(TrainerCallback):
        """The wall-clock moment a run first has something to compare (eval or first chunk)."""

        def __init__(self):
            self.first = None

        def on_evaluate(self, args, state, control, **kw):
            if self.first is None:
                self.first = time.time()

        def on_step_end(self, args, state, control, **kw):
            if not use_eval and self.first is None and state.global_step >= p.steps_per_chunk:
                self.first = time.time()

    out = {"wall_s": 0.0, "cpu_s": 0.0, "build_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "steps": 0}
    first_all = math.nan
    for i, spec in enumerate(specs):
        model = copy.deepcopy(pristine)          # a fresh base per run, outside the timed region
        args = automl.build_training_args(
            spec, output_dir=os.path.join(workdir, f"seq_{i}"), seed=42, report_to="none",
            save_strategy="no", logging_strategy="steps", logging_steps=1, disable_tqdm=True,
            eval_strategy="steps" if use_eval else "no", eval_steps=p.steps_per_chunk)
        lora = automl.build_lora_config(spec)
        marks = Marks()
        _sync(p.device)
        t0, c0 = time.time(), time.process_time()
        elapsed_before = out["wall_s"]
        with rng_guard(spec):
            peft_model = get_peft_model(model, lora)
        trainer = SFTTrainer(model=peft_model, args=args, train_dataset=train,
                             eval_dataset=evald if use_eval else None, processing_class=tok,
                             callbacks=[marks])
        # disable_tqdm=True makes Trainer print every log dict; the engine prints nothing
        trainer.remove_callback(PrinterCallback)
        evaluate, eval_time = trainer.evaluate, [0.0]

        def timed_evaluate(*a, _f=evaluate, _acc=eval_time, **k):
            s = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                _acc[0] += time.perf_counter() - s

        trainer.evaluate = timed_evaluate         # Trainer calls self.evaluate(): per-instance timer
        t1 = time.time()
        result = trainer.train()
        _sync(p.device)
        t2 = time.time()
        out["wall_s"] += t2 - t0
        out["cpu_s"] += time.process_time() - c0
        out["build_s"] += t1 - t0
        out["eval_s"] += eval_time[0]
        out["train_s"] += (t2 - t1) - eval_time[0]
        out["steps"] += int(result.global_step)
        if i == len(specs) - 1 and marks.first is not None:
            # every run has a comparison point once the last one has its first: on the
            # sequential clock (the sum of each run's own time) that is here
            first_all = elapsed_before + (marks.first - t0)
        # gaps between runs (freeing the previous run) are not on the clock: the sum of each
        # run's own time is what a user running them one by one would wait
        del trainer, peft_model, model
        if p.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out["first_all_s"] = first_all
    out["step_ms"] = 1000 * out["train_s"] / max(out["steps"], 1)
    return out


@contextlib.contextmanager
def rng_guard(spec):
    """Adapter init seeded per config, as the engine does, without touching the global stream."""
    import torch

    from rapidfire_nb.engine.rng import derive_seed, rng_fork

    with rng_fork():
        torch.manual_seed(derive_seed(42, spec.fingerprint()))
        yield


# ----------------------------------------------------------------------------------------------
# Peak memory: N=1 vs N=8 LoRA runs, each in a fresh process so high-water marks are its own


def _peak_rss_bytes() -> int:
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024   # Linux: KiB
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))


class _RssSampler:
    """Samples the current RSS every few milliseconds while training runs."""

    def __init__(self, interval: float = 0.005):
        import threading

        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)
        self.start = self.peak = 0

    def _loop(self):
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self):
        self.start = self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def mem_probe(p: Preset, n_runs: int, use_eval: bool) -> dict:
    """Train ``n_runs`` LoRA configs for two short chunks through the engine; report peaks.

    Two chunks, so every run holds its adapter and optimizer state while the others train
    (a run that completes drops its optimizer); two steps per chunk are enough for peaks.
    """
    import torch

    steps = min(p.steps_per_chunk, 2)
    mp = replace(p, steps_per_chunk=steps, num_chunks=2)
    with _quiet():
        base = build_base(mp)
        train, evald = make_datasets(mp)
        group = make_group(mp, n_runs)
        cuda = mp.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            base_alloc = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        rss_before = _peak_rss_bytes()
        sampler = _RssSampler()
        with tempfile.TemporaryDirectory(prefix="rapidfire-bench-mem-") as work, sampler:
            run = run_interleaved(mp, group, base, train, evald if use_eval else None, work)
        out = {"runs": n_runs, "rss_peak_mb": _peak_rss_bytes() / 2**20,
               "rss_before_training_mb": rss_before / 2**20,
               # the high-water mark also holds import-time peaks; sampled RSS isolates training
               "rss_training_growth_mb": (sampler.peak - sampler.start) / 2**20,
               "wall_s": run["wall_s"]}
        if cuda:
            out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            out["cuda_base_mb"] = base_alloc / 2**20
    return out


def measure_memory(p: Preset, runs: tuple[int, ...], use_eval: bool, threads: int | None,
                   timeout: float = 1800) -> dict:
    results = {}
    for n in runs:
        cmd = [sys.executable, "-c",
               "import sys; from rapidfire_nb.bench import _mem_probe_main; sys.exit(_mem_probe_main(sys.argv[1:]))",
               json.dumps({"preset": asdict(p), "runs": n, "eval": use_eval, "threads": threads})]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MEM_PROBE_TAG)), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"memory probe with {n} runs failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-3000:]}")
        results[n] = json.loads(line[len(MEM_PROBE_TAG):])
    lo, hi = results[runs[0]], results[runs[-1]]
    out = {f"n{n}": r for n, r in results.items()}
    out["rss_ratio"] = hi["rss_peak_mb"] / lo["rss_peak_mb"]
    # what training adds on top of the process (interpreter, libraries, base model, data)
    out["rss_training_growth_mb"] = {f"n{n}": r["rss_training_growth_mb"] for n, r in results.items()}
    out["runs_compared"] = list(runs)
    if "cuda_peak_mb" in lo:
        out["cuda_ratio"] = hi["cuda_peak_mb"] / lo["cuda_peak_mb"]
        out["ratio"] = out["cuda_ratio"]
        out["measure"] = "torch.cuda.max_memory_allocated"
    else:
        out["ratio"] = out["rss_ratio"]
        out["measure"] = "process RSS high-water mark (ru_maxrss)"
    return out


def _mem_probe_main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    preset = Preset(**{**spec["preset"], "lora_targets": tuple(spec["preset"]["lora_targets"])})
    if spec.get("threads"):
        import torch

        torch.set_num_threads(int(spec["threads"]))
    result = mem_probe(preset, int(spec["runs"]), bool(spec["eval"]))
    print(MEM_PROBE_TAG + json.dumps(result), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------
# Orchestration


def _median(values):
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else math.nan


def run_bench(p: Preset, repeats: int = 3, use_eval: bool = True, memory: bool = True,
              warmup: bool = True, tracking=None, threads: int | None = None, offload: str = "auto",
              mem_runs: tuple[int, int] = (1, 8), sequential_main_thread: bool = False,
              log=print) -> dict:
    """Everything ``rapidfire bench`` measures, as one JSON-able dict."""
    import torch

    if p.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"bench: preset {p.name!r} needs a CUDA GPU and none is available here "
                         f"(use --preset cpu, or --device cpu to force it, slowly)")
    if threads:
        torch.set_num_threads(threads)
    import peft
    import transformers
    import trl

    from rapidfire_nb._version import __version__

    report: dict[str, Any] = {
        "preset": asdict(p), "repeats": repeats, "eval": "both" if use_eval else "none",
        "sequential_thread": "main" if sequential_main_thread else "worker",
        "tracking": list(tracking or []),
        "offload": offload,
        "machine": {"device": p.device,
                    "device_name": torch.cuda.get_device_name(0) if p.device.startswith("cuda") else "cpu",
                    "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()},
        "versions": {"rapidfire_nb": __version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__,
                     "peft": peft.__version__},
    }
    work = tempfile.mkdtemp(prefix="rapidfire-bench-")
    try:
        with _quiet():
            pristine, tok = build_base(p)
            report["model_params"] = sum(t.numel() for t in pristine.parameters())
            train, evald = make_datasets(p)
            group = make_group(p, p.n_configs)
            specs = group.expand()
            ev = evald if use_eval else None
            if warmup:
                log("warm-up (untimed)...")
                wp = replace(p, steps_per_chunk=min(2, p.steps_per_chunk), num_chunks=1)
                wtrain, wevald = make_datasets(wp, n_train=wp.n_train)
                wgroup = make_group(wp, 1)
                run_interleaved(wp, wgroup, (copy.deepcopy(pristine), tok), wtrain,
                                wevald if use_eval else None, work, tracking, offload)
                run_sequential(wp, wgroup.expand(), pristine, tok, wtrain, wevald, work, use_eval,
                               sequential_main_thread)
            rows = []
            for r in range(repeats):
                order = ("interleaved", "sequential") if r % 2 == 0 else ("sequential", "interleaved")
                row: dict[str, Any] = {"repeat": r, "order": list(order)}
                for side in order:
                    if side == "interleaved":
                        row["interleaved"] = run_interleaved(p, group, (copy.deepcopy(pristine), tok),
                                                             train, ev, work, tracking, offload)
                    else:
                        row["sequential"] = run_sequential(p, specs, pristine, tok, train, ev, work,
                                                           use_eval, sequential_main_thread)
                    shutil.rmtree(work, ignore_errors=True)
                    os.makedirs(work, exist_ok=True)
                i, s = row["interleaved"], row["sequential"]
                row["ratio"] = i["wall_s"] / s["wall_s"]
                row["cpu_ratio"] = i["cpu_s"] / s["cpu_s"] if s["cpu_s"] > 0 else math.nan
                row["first_all_frac"] = i["first_all_s"] / s["wall_s"]
                rows.append(row)
                log(f"repeat {r + 1}/{repeats}: interleaved {i['wall_s']:.2f}s, sequential "
                    f"{s['wall_s']:.2f}s, ratio {row['ratio']:.3f}, overhead "
                    f"{100 * i['overhead_frac']:.1f}%, swap {i['swap_ms_median']:.2f} ms, first "
                    f"all-run comparison at {100 * row['first_all_frac']:.0f}% of sequential")
            del pristine
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["per_repeat"] = rows
    med = {
        "ratio": _median(r["ratio"] for r in rows),
        "cpu_ratio": _median(r["cpu_ratio"] for r in rows),
        "overhead_frac": _median(r["interleaved"]["overhead_frac"] for r in rows),
        "engine_added_frac": _median(r["interleaved"]["engine_added_frac"] for r in rows),
        "setup_frac": _median(r["interleaved"]["setup_frac"] for r in rows),
        "swap_ms": _median(r["interleaved"]["swap_ms_median"] for r in rows),
        "first_all_frac": _median(r["first_all_frac"] for r in rows),
        "interleaved_wall_s": _median(r["interleaved"]["wall_s"] for r in rows),
        "sequential_wall_s": _median(r["sequential"]["wall_s"] for r in rows),
        "first_all_s": _median(r["interleaved"]["first_all_s"] for r in rows),
        "sequential_first_all_s": _median(r["sequential"]["first_all_s"] for r in rows),
        "engine_step_ms": _median(r["interleaved"]["step_ms"] for r in rows),
        "trl_step_ms": _median(r["sequential"]["step_ms"] for r in rows),
        "engine_eval_s": _median(r["interleaved"]["eval_s"] for r in rows),
        "trl_eval_s": _median(r["sequential"]["eval_s"] for r in rows),
        "trl_build_s": _median(r["sequential"]["build_s"] for r in rows),
    }
    split_keys = ("train_s", "eval_s", "swap_s", "setup_s", "snapshot_s", "chunk_misc_s",
                  "outside_chunks_s", "write_wait_s", "checkpoint_s")
    med["engine_split_s"] = {k: _median(r["interleaved"][k] for r in rows) for k in split_keys}
    report["median"] = med
    if memory:
        log(f"memory: {mem_runs[0]} vs {mem_runs[1]} LoRA runs, one subprocess each...")
        report["memory"] = measure_memory(p, mem_runs, use_eval, threads)
    report["targets"] = check_targets(report)
    return report


def check_targets(report: dict) -> dict:
    med, C = report["median"], report["preset"]["num_chunks"]
    out = {
        "ratio": {"value": med["ratio"], "target": TARGETS["ratio"]},
        "overhead_frac": {"value": med["overhead_frac"], "target": TARGETS["overhead"]},
        "first_all_frac": {"value": med["first_all_frac"],
                           "target": 1 / C + TARGETS["first_all_slack"]},
    }
    if "memory" in report:
        out["memory_ratio"] = {"value": report["memory"]["ratio"], "target": TARGETS["memory_ratio"],
                               "runs_compared": report["memory"]["runs_compared"]}
    for v in out.values():
        v["met"] = bool(v["value"] <= v["target"])
    return out


def format_report(report: dict) -> str:
    p, med, tg = report["preset"], report["median"], report["targets"]
    lines = [
        f"rapidfire bench -- preset {p['name']}: {p['description']}",
        f"  {report['model_params'] / 1e6:.2f}M params, {p['n_configs']} LoRA configs (r={p['lora_r']} on "
        f"{','.join(p['lora_targets'])}) x {p['num_chunks']} chunks x {p['steps_per_chunk']} steps, "
        f"batch {p['batch']}" + (f" x {p['seq_len']} tokens" if p["seq_len"] else "")
        + f", {p['dtype']}, {report['machine']['device_name']}, {report['machine']['torch_threads']} "
        f"torch threads; eval: {report['eval']}; offload: {report.get('offload', 'auto')}; medians of "
        f"{report['repeats']} repeats",
        "  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        f"  interleaved wall  {med['interleaved_wall_s']:8.2f} s   sequential wall {med['sequential_wall_s']:8.2f} s",
        f"  step time         engine {med['engine_step_ms']:.1f} ms   TRL {med['trl_step_ms']:.1f} ms "
        f"(TRL: train() time less eval, over steps: includes train()'s set-up)",
        f"  eval time         engine {med['engine_eval_s']:.2f} s   TRL {med['trl_eval_s']:.2f} s; "
        f"TRL trainer builds {med['trl_build_s']:.2f} s",
        "  engine split (s): " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in med["engine_split_s"].items()
                                          if k != "checkpoint_s")
        + f"; checkpoint writes {med['engine_split_s']['checkpoint_s']:.2f} (writer thread)",
        f"  first all-run comparison: {med['first_all_s']:.2f} s interleaved vs "
        f"{med['sequential_first_all_s']:.2f} s sequential",
        "",
    ]

    def row(name, key, fmt):
        t = tg.get(key)
        if t is None:
            return
        mark = "ok  " if t["met"] else "MISS"
        lines.append(f"  [{mark}] {name:<34} {fmt(t['value']):>10}   target <= {fmt(t['target'])}")

    lines.append("  targets: [ok  ] met, [MISS] not met on this machine in this run (a goal to work on, not an error);")
    lines.append("  each figure is a median; lower is better for all of them:")
    row("wall-time ratio interleaved/seq", "ratio", lambda v: f"{v:.3f}")
    lines.append("         (interleaved / sequential TRL, same steps and evals: below 1.0 is possible because")
    lines.append("         the engine builds each run's trainer once and pays no per-train() set-up per chunk)")
    row("engine overhead", "overhead_frac", lambda v: f"{100 * v:.1f} %")
    lines.append("         (share of the interleaved wall time outside forward/backward/optimizer and eval)")
    setup_pct, added_pct = f"{100 * med['setup_frac']:.1f} %", f"{100 * med['engine_added_frac']:.1f} %"
    lines.append(f"         {'  of which: the runs set-up (TRL)':<34} {setup_pct:>10}   (sequential TRL builds its "
                 f"trainers too: {med['trl_build_s']:.2f} s)")
    lines.append(f"         {'  of which: added by the engine':<34} {added_pct:>10}   (swaps, snapshots, "
                 "scheduling, log writes, waits)")
    row("first all-run comparison / seq", "first_all_frac", lambda v: f"{100 * v:.1f} %")
    lines.append("         (when every run has its first eval point, as a share of the sequential total;"
                 " target: 1/N runs + slack)")
    if "memory_ratio" in tg:
        lo, hi = tg["memory_ratio"]["runs_compared"]
        row(f"peak memory {hi} runs / {lo} run", "memory_ratio", lambda v: f"{v:.3f}")
        lines.append("         (runs share one base model: more runs should cost little more memory)")
    lines.append(f"  time per swap (median)                 {med['swap_ms']:.3f} ms")
    lines.append(f"  CPU-time ratio interleaved/seq         {med['cpu_ratio']:.3f}")
    if "memory" in report:
        m = report["memory"]
        keys = [k for k in m if k.startswith("n") and isinstance(m[k], dict) and "runs" in m[k]]
        desc = "; ".join(
            f"{m[k]['runs']} run(s): RSS peak {m[k]['rss_peak_mb']:.0f} MiB"
            + (f", CUDA peak {m[k]['cuda_peak_mb']:.0f} MiB" if "cuda_peak_mb" in m[k] else "")
            for k in keys)
        lines.append(f"  memory ({m['measure']}): {desc}; RSS growth during training "
                     + ", ".join(f"{k} {v:.1f} MiB" for k, v in m["rss_training_growth_mb"].items()))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rapidfire bench",
        description="Train N LoRA configs interleaved through the engine and the same N configs one "
                    "after another with plain TRL SFTTrainer.train(), in this process; report the "
                    "wall-time ratio, the engine's overhead, time per swap, peak memory (1 vs 8 runs) "
                    "and when the first all-run comparison is available, each against a target "
                    "([ok] met, [MISS] not met). Takes about 4 minutes with the cpu preset on 2 CPU "
                    "cores (a warm-up, 3 repeats and the memory probes; --repeats 1 --no-memory: "
                    "about 1 minute); the smoke preset takes seconds (about a minute with "
                    "--workers: Ray and the workers start for every side and repeat).")
    ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS),
                    help="cpu: ~4.5M-param Llama, fp32 (default); tinyllama: 1.1B-shaped, bf16, CUDA")
    ap.add_argument("--repeats", type=int, default=3, help="repeats (medians are reported); default 3")
    ap.add_argument("--configs", type=int, default=None, help="number of LoRA configs (default: preset's)")
    ap.add_argument("--chunks", type=int, default=None, help="chunks per run (default: preset's)")
    ap.add_argument("--steps-per-chunk", type=int, default=None, help="optimizer steps per chunk")
    ap.add_argument("--device", default=None, help="override the preset's device (cpu, cuda)")
    ap.add_argument("--eval", choices=("both", "none"), default="both",
                    help="both: the same eval after every chunk on both sides (default); none: no eval")
    ap.add_argument("--no-memory", action="store_true", help="skip the 1-vs-8-run memory probes")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--offload", choices=("auto", "always", "never"), default="auto",
                    help="the engine's Experiment(offload=...): 'always' parks every idle run in host "
                         "memory, to measure what a swap costs when runs do not fit on the device")
    ap.add_argument("--tracking", default="", help="comma-separated trackers for the engine side "
                                                   "(default none)")
    ap.add_argument("--sequential-main-thread", action="store_true",
                    help="run the TRL baseline in the main thread (default: a worker thread, like "
                         "the engine's training thread)")
    ap.add_argument("--pruner", choices=("sha", "median", "hyperband"), default=None,
                    help="run the pruning comparison instead: an 8-config grid (4 learning rates x 2 LoRA ranks) trained in full "
                         "and with this pruner; best final eval loss and wall time of each")
    ap.add_argument("--reduction-factor", type=int, default=2, help="with --pruner: keep 1/N per rung")
    ap.add_argument("--workers", type=int, default=None,
                    help="train 8 runs three ways: in the kernel, on 1 Ray worker and on N; report "
                         "wall times and the per-chunk actor hop (needs Ray: pip install -e "
                         "'.[ray]'; with the cpu preset and --repeats 1, about 6 minutes on a busy 2-core "
                         "machine, most of it Ray start-up and the 1-worker side; with --preset smoke "
                         "about a minute, not seconds: Ray and the workers start for every side)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    ap.add_argument("--output", default=None, help="also write the JSON report to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.pruner:   # issue 18: a pruned grid against the full one (run_pruner_bench)
        return _pruner_main(args)
    p = PRESETS[args.preset]
    if args.workers is not None and args.workers < 1:
        print(f"rapidfire bench: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    changes = {}
    for name, key in (("configs", "n_configs"), ("chunks", "num_chunks"),
                      ("steps_per_chunk", "steps_per_chunk")):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                print(f"rapidfire bench: --{name.replace('_', '-')} must be >= 1, got {value}",
                      file=sys.stderr)
                return 2
            changes[key] = value
    if args.device:
        changes["device"] = args.device
    p = replace(p, **changes)
    if args.repeats < 1:
        print(f"rapidfire bench: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if not 1 <= p.n_configs <= len(LEARNING_RATES):
        print(f"rapidfire bench: --configs must be between 1 and {len(LEARNING_RATES)}, got "
              f"{p.n_configs}", file=sys.stderr)
        return 2
    if args.workers:   # issue 19: kernel vs Ray workers (rapidfire_nb/bench_workers.py)
        from rapidfire_nb.bench_workers import workers_main

        return workers_main(args, p)
    tracking = [t.strip() for t in args.tracking.split(",") if t.strip()]
    log = (lambda *a, **k: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a, **k: print(*a, flush=True))
    log(f"rapidfire bench: preset {p.name}, {p.n_configs} configs x {p.num_chunks} chunks x "
        f"{p.steps_per_chunk} steps, {args.repeats} repeat(s)...")
    report = run_bench(p, repeats=args.repeats, use_eval=args.eval == "both",
                       memory=not args.no_memory, warmup=not args.no_warmup, tracking=tracking,
                       offload=args.offload,
                       threads=args.threads, sequential_main_thread=args.sequential_main_thread,
                       log=log)
    text = json.dumps(report, indent=1, default=_json_default)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text if args.json else format_report(report), flush=True)
    return 0


def _json_default(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return str(obj)


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------------------------
# rapidfire bench --pruner sha: does pruning at chunk boundaries find the same best run, faster?

PRUNER_LRS = (1e-2, 3e-3, 1e-3, 3e-4)
PRUNER_RANKS = (4, 32)
PRUNER_TARGETS = {"loss_gap": 0.02, "time_ratio": 0.50}


def make_pruner_group(p: Preset, pruner: str | None, reduction_factor: int = 2):
    """8 LoRA configs that really differ: 4 learning rates x 2 ranks, optionally pruned."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    cfg = RFModelConfig(
        model_name=f"bench-{p.name}",
        peft_config=List([RFLoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                       target_modules=list(p.lora_targets)) for r in PRUNER_RANKS]),
        training_args=RFSFTConfig(learning_rate=List(list(PRUNER_LRS)), **training_kwargs(p)))
    kw = dict(pruner=pruner, reduction_factor=reduction_factor) if pruner else {}
    return RFGridSearch(cfg, trainer_type="SFT", **kw)


def run_pruner_side(p: Preset, pruner: str | None, workdir: str, reduction_factor: int = 2) -> dict:
    from rapidfire_nb.experiment import Experiment

    model, tok = build_base(p)
    train, evald = make_datasets(p)
    group = make_pruner_group(p, pruner, reduction_factor)
    exp = Experiment(f"prune-{pruner or 'full'}-{int(time.time() * 1000)}", experiment_path=workdir,
                     tracking=[])
    try:
        with _quiet():
            _sync(p.device)
            t0 = time.time()
            exp.run_fit(group, lambda cfg: (model, tok), train, evald, num_chunks=p.num_chunks,
                        seed=42, block=True)
            _sync(p.device)
            wall = time.time() - t0
        info = exp.get_runs_info()
    finally:
        exp.end()
    done = info[info.status == "completed"]
    runs = [{"run_id": int(r.run_id), "status": r.status, "learning_rate": r.learning_rate, "r": r.r,
             "chunks_done": int(r.chunks_done), "eval_loss": float(r.eval_loss),
             "pruning": getattr(r, "pruning", None) if isinstance(getattr(r, "pruning", None), str) else None}
            for r in info.itertuples()]
    best = done.loc[done.eval_loss.idxmin()] if len(done) else None
    return {"pruner": pruner, "wall_s": wall, "chunks_trained": int(info.chunks_done.sum()),
            "best_final_eval_loss": None if best is None else float(best.eval_loss),
            "best_run": None if best is None else int(best.run_id), "runs": runs}


def run_pruner_bench(p: Preset, pruner: str, reduction_factor: int = 2, log=print) -> dict:
    work = tempfile.mkdtemp(prefix="rfbench-prune-")
    try:
        log(f"  full grid ({len(PRUNER_LRS) * len(PRUNER_RANKS)} configs)...")
        full = run_pruner_side(p, None, work)
        log(f"  pruned grid ({pruner}, reduction_factor={reduction_factor})...")
        pruned = run_pruner_side(p, pruner, work, reduction_factor)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gap = (pruned["best_final_eval_loss"] - full["best_final_eval_loss"]) / abs(full["best_final_eval_loss"])
    ratio = pruned["wall_s"] / full["wall_s"]
    return {"preset": asdict(p), "full": full, "pruned": pruned, "loss_gap": gap, "time_ratio": ratio,
            "targets": PRUNER_TARGETS,
            "met": {"loss_gap": gap <= PRUNER_TARGETS["loss_gap"],
                    "time_ratio": ratio <= PRUNER_TARGETS["time_ratio"]}}


def format_pruner_report(r: dict) -> str:
    lines = []
    for side in ("full", "pruned"):
        s = r[side]
        lines.append(f"  {side:6s} ({s['pruner'] or 'no pruner'}): wall {s['wall_s']:.1f} s, "
                     f"{s['chunks_trained']} chunks trained, best final eval loss "
                     f"{s['best_final_eval_loss']:.4f} (run {s['best_run']})")
    lines.append(f"  best-loss gap {100 * r['loss_gap']:+.2f} % (target <= {100 * r['targets']['loss_gap']:.0f} %: "
                 f"{'met' if r['met']['loss_gap'] else 'MISSED'}); wall-time ratio {r['time_ratio']:.2f} "
                 f"(target <= {r['targets']['time_ratio']:.2f}: {'met' if r['met']['time_ratio'] else 'MISSED'})")
    for run in r["pruned"]["runs"]:
        lines.append(f"    run {run['run_id']}: lr {run['learning_rate']:g}, r {run['r']}, {run['status']} after "
                     f"{run['chunks_done']} chunks, eval loss {run['eval_loss']:.4f}"
                     + (f" -- {run['pruning']}" if run["pruning"] else ""))
    return "\n".join(lines)


def _pruner_main(args) -> int:
    p = PRESETS[args.preset]
    # twice the default chunks at half the steps: rungs at 1, 2, 4, 8 chunks (same steps per run)
    changes = {"num_chunks": 8, "steps_per_chunk": 4} if args.preset == "cpu" else {}
    if args.chunks is not None:
        changes["num_chunks"] = args.chunks
    if args.steps_per_chunk is not None:
        changes["steps_per_chunk"] = args.steps_per_chunk
    if args.device:
        changes["device"] = args.device
    if any(v < 1 for k, v in changes.items() if k != "device") or args.reduction_factor < 2:
        print("rapidfire bench: --chunks/--steps-per-chunk must be >= 1 and --reduction-factor >= 2",
              file=sys.stderr)
        return 2
    p = replace(p, **changes)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    log = (lambda *a, **k: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a, **k: print(*a, flush=True))
    log(f"rapidfire bench --pruner {args.pruner}: preset {p.name}, 8 configs x {p.num_chunks} chunks x "
        f"{p.steps_per_chunk} steps (timings on a shared machine are noisy)")
    report = run_pruner_bench(p, args.pruner, args.reduction_factor, log=log)
    text = json.dumps(report, indent=1, default=_json_default)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text if args.json else format_pruner_report(report), flush=True)
    return 0
