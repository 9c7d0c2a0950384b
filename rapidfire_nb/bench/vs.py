"""``rapidfire bench --vs optuna,ray-tune``: time to the winner, beside what users run instead.

One invocation trains the same search space (learning rate x LoRA rank, ``PRUNER_LRS`` x
``PRUNER_RANKS``: 8 configs that really differ), on the same data, base model and per-config budget
(``num_chunks`` x ``steps_per_chunk`` optimizer steps), on this one device, several ways:

* ``sequential``        plain TRL, every config to the end, one after another (the floor);
* ``optuna-grid-sha``   Optuna + TRL as its users write it: a study with ``GridSampler`` over the
  ``optuna-grid-median``  same configs, or ``TPESampler(seed=42)``, and ``SuccessiveHalvingPruner``
  ``optuna-tpe-sha``      or ``MedianPruner``; each trial one ``SFTTrainer(...).train()`` whose
  ``optuna-tpe-median``   callback reports the eval loss at the sample counts our chunks end at and
                        raises ``TrialPruned`` when ``trial.should_prune()``; trials one after another;
* ``ray-asha``          Ray Tune + TRL: ``Tuner`` over ``tune.grid_search`` with ``ASHAScheduler``
                        (grace period one chunk's samples, our reduction factor), one trial at a
                        time (``max_concurrent_trials=1``, ``reuse_actors=True``);
* ``rapidfire-sha``     the engine interleaving the grid with ``pruner="sha"`` (same rungs and
                        reduction factor);
* ``rapidfire-optuna``  the engine with ``RFOptuna`` (TPE, ``pruner="sha"``, same budget of trials).

Why the Optuna side is a plain objective and not ``Trainer.hyperparameter_search(backend="optuna")``:
that method needs a ``model_init`` and TRL's ``SFTTrainer`` takes none (it raises "you need to pass
your model through a model_init function"); the LoRA rank, which the search varies, is applied when
the trainer is built. So the Optuna side is what Optuna's own pruning examples show (report, then
``should_prune``/``TrialPruned``), hooked where transformers' own Optuna backend hooks it (after
each evaluation, ``Trainer._report_to_hp_search``). The same holds for Ray Tune's backend there.

Every side gives a trace: eval points (time, run, samples, eval loss) and ends (finished or
pruned). From a trace, the same code computes, per side:

* ``t_lead_s``       from when the eventual winner (best final eval loss among the runs trained to
                     the end) is ranked first (by each run's latest eval loss) and stays first;
* ``t_last_out_s``   when the last competitor is pruned or finished;
* ``t_winner_s``     the later of the two: when the winner is identified (the headline figure);
* ``t_within_1pct_s`` when any run first reaches within 1 % of the reference loss (the best final
                     eval loss of the full sequential grid: every config trained to the end);
* ``best_final_eval_loss``, ``steps`` (optimizer steps trained), ``wall_s``, peak memory.

Fairness: the same thread count everywhere (Ray trials set it too); imports and the base model's
copy are off every clock (the in-process sides import before timing; a Ray trial's process start,
imports and base build are measured in the trial and taken off its clock, as is each trial's base
copy); the in-process sides train in a worker thread, as the engine does; the order of the sides
turns from repeat to repeat; min/median/max over repeats.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from typing import Any

from rapidfire_nb.bench.presets import PRESETS, Preset, _quiet, _sync, build_base, make_datasets, with_overrides
from rapidfire_nb.bench.pruner import PRUNER_LRS, PRUNER_RANKS, make_pruner_group

PEERS = ("optuna", "ray-tune")
WITHIN = 0.01           # "within 1 % of the best final eval loss"
WIN_MARGIN = 0.01       # a peer "wins" a figure when its median is better by more than this
TARGET = {"time_ratio": 0.5, "loss_gap": 0.02}   # rapidfire-sha vs Optuna + TRL's best pruner
SIDE_NOTES = {
    "sequential": "plain TRL SFTTrainer.train(), every config to the end",
    "optuna-grid-sha": "Optuna GridSampler + SuccessiveHalvingPruner, trials one after another",
    "optuna-grid-median": "Optuna GridSampler + MedianPruner (defaults: 5 startup trials)",
    "optuna-tpe-sha": "Optuna TPESampler(seed=42) + SuccessiveHalvingPruner",
    "optuna-tpe-median": "Optuna TPESampler(seed=42) + MedianPruner",
    "ray-asha": "Ray Tune Tuner + ASHAScheduler, one trial at a time",
    "rapidfire-sha": "rapidfire_nb RFGridSearch(pruner='sha'), runs interleaved by chunk",
    "rapidfire-optuna": "rapidfire_nb RFOptuna(sampler='tpe', pruner='sha'), interleaved",
}
MORE_DEVICES = {
    "sequential": "k devices: k configs at once (k times faster at best); no early answer",
    "optuna": "k devices: k processes sharing one study (RDB storage); the asynchronous pruners "
              "then judge against more history sooner, so fewer trials reach the end",
    "ray-tune": "k devices: max_concurrent_trials=k; ASHA is built for that (asynchronous rungs), "
                "its start-up cost is paid once",
    "rapidfire": "k devices: num_workers=k Ray workers train k runs at once, still in lockstep "
                 "by chunk (rapidfire bench --workers)",
}


def vs_preset(name: str) -> Preset:
    p = PRESETS[name]
    # eight chunks of four steps on the cpu preset: rungs at 1, 2, 4, 8 chunks, as --pruner uses
    return replace(p, num_chunks=8, steps_per_chunk=4) if name == "cpu" else p


def space() -> list[dict]:
    return [{"learning_rate": lr, "r": r} for lr in PRUNER_LRS for r in PRUNER_RANKS]


def _key(lr: float, r: int) -> str:
    return f"lr={lr:g},r={int(r)}"


def grid_specs(p: Preset) -> dict[str, Any]:
    """(learning rate, rank) -> the engine's own run spec for it: every side builds its TRL/PEFT
    configs from these, so every side trains the very same configs."""
    from rapidfire_nb import automl

    out = {}
    for spec in make_pruner_group(p, None).expand():
        lora = automl.build_lora_config(spec)
        args = automl.build_training_args(spec, output_dir="unused", report_to="none")
        out[_key(args.learning_rate, lora.r)] = spec
    return out


# -- one trace per side ---------------------------------------------------------------------------

class Trace:
    """A side's events on wall-clock time, and the intervals taken off its clock."""

    def __init__(self, name: str):
        self.name = name
        self.t0 = self.t_end = 0.0
        self.events: list[dict] = []
        self.excluded: list[tuple[float, float]] = []
        self.steps = 0
        self.peak: dict[str, float] = {}
        self.split: dict[str, float] = {}     # the engine's own time split (rapidfire sides)

    def to_json(self) -> dict:
        return {"t0": self.t0, "t_end": self.t_end, "events": self.events, "excluded": self.excluded,
                "steps": self.steps, "peak": self.peak, "split": self.split}

    @classmethod
    def from_json(cls, name: str, d: dict) -> Trace:
        tr = cls(name)
        tr.t0, tr.t_end, tr.events, tr.steps = d["t0"], d["t_end"], d["events"], d["steps"]
        tr.excluded = [tuple(x) for x in d["excluded"]]
        tr.peak, tr.split = d.get("peak", {}), d.get("split", {})
        return tr

    def start(self):
        self.t0 = time.time()

    def stop(self):
        self.t_end = time.time()

    def exclude(self, a: float, b: float):
        if b > a:
            self.excluded.append((a, b))

    def eval(self, run: str, params: str, samples: int, loss: float, t: float | None = None):
        self.events.append({"t": time.time() if t is None else t, "kind": "eval", "run": run,
                            "params": params, "samples": int(samples), "loss": float(loss)})

    def end(self, run: str, params: str, status: str, t: float | None = None):
        self.events.append({"t": time.time() if t is None else t, "kind": "end", "run": run,
                            "params": params, "status": status})

    def clock(self, t: float) -> float:
        """Seconds since the start, less the excluded time before ``t``."""
        merged: list[list[float]] = []
        for a, b in sorted(self.excluded):
            a, b = max(a, self.t0), min(b, t)
            if b <= a:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return (t - self.t0) - sum(b - a for a, b in merged)


def summarize(trace: Trace, ref_loss: float | None, full_samples: int) -> dict:
    """The per-side figures, from its trace alone (the same code for every side)."""
    events = sorted(trace.events, key=lambda e: (e["t"], e["kind"] == "end"))
    finals: dict[str, float] = {}
    params: dict[str, str] = {}
    for e in events:
        params[e["run"]] = e["params"]
        if e["kind"] == "eval" and e["samples"] >= full_samples:
            finals[e["run"]] = e["loss"]
    # a run pruned at its last rung trained the whole budget but is no finished trial (Optuna
    # keeps no value for it): the winner is among the runs that ended finished
    for e in events:
        if e["kind"] == "end" and e["status"] != "finished":
            finals.pop(e["run"], None)
    winner = min(finals, key=lambda r: (finals[r], r)) if finals else None
    latest: dict[str, float] = {}
    t_lead = None
    t_within = None
    for e in events:
        if e["kind"] != "eval":
            continue
        latest[e["run"]] = e["loss"]
        first = min(latest, key=lambda r: (latest[r], r))
        if first == winner:
            t_lead = e["t"] if t_lead is None else t_lead
        else:
            t_lead = None
        if t_within is None and ref_loss is not None and e["loss"] <= ref_loss * (1 + WITHIN):
            t_within = e["t"]
    ends = {e["run"]: e for e in events if e["kind"] == "end"}
    others = [e["t"] for r, e in ends.items() if r != winner]
    t_last_out = max(others) if others else trace.t0
    pruned = sum(1 for e in ends.values() if e["status"] == "pruned")
    clock = trace.clock
    out = {
        "wall_s": clock(trace.t_end),
        "t_lead_s": None if t_lead is None else clock(t_lead),
        "t_last_out_s": clock(t_last_out),
        "t_winner_s": None if t_lead is None else clock(max(t_lead, t_last_out)),
        "t_within_1pct_s": None if t_within is None else clock(t_within),
        "best_final_eval_loss": None if winner is None else finals[winner],
        "winner": None if winner is None else params[winner],
        "runs": len(params), "finished": len(finals), "pruned": pruned,
        "distinct_configs": len(set(params.values())),
        "steps": trace.steps, "excluded_s": (trace.t_end - trace.t0) - clock(trace.t_end),
        **trace.peak,
    }
    if trace.split:
        out["split_s"] = dict(trace.split)
    return out


# -- memory ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _peak(trace: Trace, device: str):
    from rapidfire_nb.bench.memory import _RssSampler

    cuda = device.startswith("cuda")
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with _RssSampler() as s:
        yield
    trace.peak["peak_rss_mb"] = s.peak / 2**20
    # what training adds over the process at the side's start (which already holds the base
    # model, the data and whatever earlier sides left in this process)
    trace.peak["rss_growth_mb"] = (s.peak - s.start) / 2**20
    if cuda:
        import torch

        trace.peak["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20


# -- the TRL peers: one trainer per trial -----------------------------------------------------------

def _trl_trial(p: Preset, spec, pristine, tok, train, evald, workdir: str, on_eval,
               exclude) -> int:
    """One config trained alone with ``SFTTrainer``, evaluated every ``steps_per_chunk`` steps;
    ``on_eval(samples, loss)`` may raise to end the trial (a pruner). Returns optimizer steps."""
    from peft import get_peft_model
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    from rapidfire_nb import automl
    from rapidfire_nb.bench.runners import rng_guard

    a = time.time()
    model = copy.deepcopy(pristine)          # a fresh base: off the clock, as on every side
    exclude(a, time.time())
    state = {"steps": 0}

    class Report(TrainerCallback):
        def on_step_end(self, args, st, control, **kw):
            state["steps"] = st.global_step

        def on_evaluate(self, args, st, control, metrics=None, **kw):
            on_eval(st.global_step * p.batch, float(metrics["eval_loss"]))

    args = automl.build_training_args(
        spec, output_dir=workdir, seed=42, report_to="none", save_strategy="no",
        logging_strategy="steps", logging_steps=1, disable_tqdm=True, eval_strategy="steps",
        eval_steps=p.steps_per_chunk)
    with rng_guard(spec):
        peft_model = get_peft_model(model, automl.build_lora_config(spec))
    trainer = SFTTrainer(model=peft_model, args=args, train_dataset=train, eval_dataset=evald,
                         processing_class=tok, callbacks=[Report()])
    trainer.remove_callback(PrinterCallback)
    try:
        trainer.train()
    finally:
        del trainer, peft_model, model
        if p.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    return state["steps"]


def run_sequential_side(p, specs, pristine, tok, train, evald, work) -> Trace:
    tr = Trace("sequential")
    with _peak(tr, p.device):
        tr.start()
        for i, (key, spec) in enumerate(specs.items()):
            run = f"seq{i}"
            tr.steps += _trl_trial(p, spec, pristine, tok, train, evald, os.path.join(work, run),
                                   lambda s, loss, run=run, key=key: tr.eval(run, key, s, loss),
                                   tr.exclude)
            tr.end(run, key, "finished")
        _sync(p.device)
        tr.stop()
    return tr


def run_optuna_side(p, specs, pristine, tok, train, evald, work, sampler: str, pruner: str,
                    reduction_factor: int) -> Trace:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lrs, ranks = list(PRUNER_LRS), list(PRUNER_RANKS)
    chunk_samples = p.steps_per_chunk * p.batch
    if sampler == "grid":
        smp = optuna.samplers.GridSampler({"learning_rate": lrs, "r": ranks}, seed=42)
    else:
        # 4 random start-up trials of 8, as RFOptuna's sampler; TPE's default (10) would leave
        # all 8 random
        smp = optuna.samplers.TPESampler(seed=42, n_startup_trials=4)
    if pruner == "sha":
        prn = optuna.pruners.SuccessiveHalvingPruner(min_resource=chunk_samples,
                                                     reduction_factor=reduction_factor,
                                                     min_early_stopping_rate=0)
    else:
        prn = optuna.pruners.MedianPruner()          # documented defaults
    tr = Trace(f"optuna-{sampler}-{pruner}")
    study = optuna.create_study(direction="minimize", sampler=smp, pruner=prn)

    def objective(trial):
        lr = trial.suggest_categorical("learning_rate", lrs)
        r = trial.suggest_categorical("r", ranks)
        key, run = _key(lr, r), f"t{trial.number}"
        last = {"loss": math.nan}

        def on_eval(samples, loss):
            tr.eval(run, key, samples, loss)
            last["loss"] = loss
            trial.report(loss, samples)
            if trial.should_prune():
                tr.end(run, key, "pruned")
                raise optuna.TrialPruned()

        steps = [0]
        try:
            steps[0] = _trl_trial(p, specs[key], pristine, tok, train, evald,
                                  os.path.join(work, run), on_eval, tr.exclude)
        except optuna.TrialPruned:
            # the steps trained before the prune: up to the rung it was judged at
            tr.steps += max(e["samples"] for e in tr.events if e["run"] == run and e["kind"] == "eval") // p.batch
            raise
        tr.steps += steps[0]
        tr.end(run, key, "finished")
        return last["loss"]

    with _peak(tr, p.device):
        tr.start()
        study.optimize(objective, n_trials=len(specs))
        _sync(p.device)
        tr.stop()
    return tr


def run_rapidfire_side(p, kind: str, pristine, tok, train, evald, work, reduction_factor: int) -> Trace:
    from rapidfire_nb.automl import List, RFLoraConfig, RFModelConfig, RFOptuna, RFSFTConfig
    from rapidfire_nb.bench.presets import training_kwargs
    from rapidfire_nb.experiment import Experiment

    if kind == "sha":
        group = make_pruner_group(p, "sha", reduction_factor)
    else:
        cfg = RFModelConfig(
            model_name=f"bench-{p.name}",
            peft_config=List([RFLoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                           target_modules=list(p.lora_targets)) for r in PRUNER_RANKS]),
            training_args=RFSFTConfig(learning_rate=List(list(PRUNER_LRS)), **training_kwargs(p)))
        n = len(PRUNER_LRS) * len(PRUNER_RANKS)
        group = RFOptuna(cfg, trainer_type="SFT", n_initial=n // 2, budget=n, sampler="tpe",
                         pruner="sha", reduction_factor=reduction_factor, seed=42)
    model = copy.deepcopy(pristine)
    tr = Trace(f"rapidfire-{kind}")
    exp = Experiment(f"vs-{kind}-{int(time.time() * 1000)}", experiment_path=work, tracking=[])
    try:
        with _peak(tr, p.device):
            tr.start()
            exp.run_fit(group, lambda cfg: (model, tok), train, evald, num_chunks=p.num_chunks,
                        seed=42, block=True)
            _sync(p.device)
            tr.stop()
        info = exp.get_runs_info()
        events = exp.events.since(0)
        tl = exp.get_timeline()
    finally:
        exp.end()
    keys = {int(r.run_id): _key(float(r.learning_rate), int(r.r)) for r in info.itertuples()}
    # where the engine's time goes: the sums over chunks of its own per-chunk split
    tr.split = {k: float(tl[k].fillna(0).sum()) for k in ("train_s", "eval_s", "setup_s", "swap_s",
                                                          "snapshot_s", "other_s") if k in tl}
    tr.split["chunks"] = len(tl)
    tr.steps = int(info["completed_steps"].sum())
    for e in events:
        if e["type"] == "metric" and e.get("split") == "eval" and "eval_loss" in (e.get("metrics") or {}):
            tr.eval(f"run{e['run_id']}", keys[e["run_id"]], e["samples_seen"], e["metrics"]["eval_loss"],
                    t=e["time"])
        elif e["type"] == "run_status" and e["status"] in ("completed", "stopped", "failed"):
            status = "finished" if e["status"] == "completed" else \
                "pruned" if e.get("pruned") or e["status"] == "stopped" else e["status"]
            tr.end(f"run{e['run_id']}", keys[e["run_id"]], status, t=e["time"])
    bad = info[~info.status.isin(["completed", "stopped"])]
    if len(bad):
        raise RuntimeError(f"{tr.name}: runs ended badly: " + "; ".join(
            f"run {r.run_id} {r.status} {str(r.error)[-300:]}" for r in bad.itertuples()))
    return tr


# -- Ray Tune + TRL ----------------------------------------------------------------------------------

_RAY_CACHE: dict[str, Any] = {}
RAY_NICENESS = "RAY_worker_niceness"


def _ray_trial(config: dict, preset: dict, threads: int) -> None:
    """One Ray Tune trial (a function trainable): the config trained alone with ``SFTTrainer``,
    ``tune.report`` after every eval. The process's start, imports and the base build (once per
    actor: ``reuse_actors=True``) and each base copy are reported, to be taken off the clock."""
    import psutil
    import torch
    from ray import tune

    from rapidfire_nb._quiet import import_peft_quietly
    from rapidfire_nb.bench.memory import _RssSampler

    torch.set_num_threads(threads)
    p = Preset(**{**preset, "lora_targets": tuple(preset["lora_targets"])})
    if "base" not in _RAY_CACHE:
        import_peft_quietly()
        with _quiet():
            _RAY_CACHE["base"] = build_base(p)
            _RAY_CACHE["data"] = make_datasets(p)
            _RAY_CACHE["specs"] = grid_specs(p)
        _RAY_CACHE["boot"] = (psutil.Process().create_time(), time.time())
        _RAY_CACHE["rss_ready"] = psutil.Process().memory_info().rss
    pristine, tok = _RAY_CACHE["base"]
    train, evald = _RAY_CACHE["data"]
    key = _key(config["learning_rate"], config["r"])
    copies: list[tuple[float, float]] = []
    boot_a, boot_b = _RAY_CACHE["boot"]
    cuda = p.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with _RssSampler() as rss, _quiet(), tempfile.TemporaryDirectory(prefix="rfvs-ray-") as work:
        def on_eval(samples, loss):
            tune.report({"eval_loss": loss, "samples": samples, "t": time.time(), "key": key,
                         "boot_a": boot_a, "boot_b": boot_b,
                         "copy_a": copies[0][0], "copy_b": copies[0][1],
                         "rss_peak_mb": max(rss.peak, rss._proc.memory_info().rss) / 2**20,
                         "rss_ready_mb": _RAY_CACHE["rss_ready"] / 2**20,
                         "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0})

        _trl_trial(p, _RAY_CACHE["specs"][key], pristine, tok, train, evald, work, on_eval,
                   lambda a, b: copies.append((a, b)))


def ray_start() -> tuple[float, bool]:
    """Local Ray as the engine starts it (loopback only), unless one is up: (seconds it took, off
    every clock; whether it was started here, to be shut down after)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from rapidfire_nb.engine import init_local_ray

    t = time.time()
    if ray.is_initialized():
        return 0.0, False
    # Ray starts its workers at niceness 15 (its worker_niceness): on a machine with other work a
    # Tune trial would get the CPU only after everything else, while the other sides run at the
    # bench's own priority. The same priority for every side: 0 (the default niceness) here.
    was = os.environ.get(RAY_NICENESS)
    os.environ[RAY_NICENESS] = "0"
    try:
        try:
            init_local_ray(ray)
        except Exception:  # Ray waits 30 s for its node; a very busy machine can miss that once
            ray.shutdown()
            init_local_ray(ray)
    finally:
        if was is None:
            os.environ.pop(RAY_NICENESS, None)
        else:
            os.environ[RAY_NICENESS] = was
    return time.time() - t, True


def run_ray_side(p, threads: int, reduction_factor: int, work: str) -> Trace:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    chunk_samples = p.steps_per_chunk * p.batch
    sched = ASHAScheduler(time_attr="samples", max_t=p.steps_per_run * p.batch,
                          grace_period=chunk_samples, reduction_factor=reduction_factor, brackets=1)
    resources = {"cpu": threads}
    if p.device.startswith("cuda"):
        resources["gpu"] = 1
    trainable = tune.with_resources(tune.with_parameters(_ray_trial, preset=asdict(p), threads=threads),
                                    resources)
    tuner = tune.Tuner(
        trainable,
        param_space={"learning_rate": tune.grid_search(list(PRUNER_LRS)),
                     "r": tune.grid_search(list(PRUNER_RANKS))},
        tune_config=tune.TuneConfig(metric="eval_loss", mode="min", scheduler=sched,
                                    max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=os.path.join(work, "ray_results"), verbose=0))
    tr = Trace("ray-asha")
    tr.start()
    # Tune prints its own tables: keep them out of the report (and --json's output)
    with contextlib.redirect_stdout(sys.stderr):
        grid = tuner.fit()
    tr.stop()
    full = p.steps_per_run * p.batch
    rss = cuda = growth = 0.0
    for i, res in enumerate(grid):
        if res.error:
            raise RuntimeError(f"ray-asha: trial {i} failed: {res.error}")
        df = res.metrics_dataframe.sort_values("t")
        run = f"ray{i}"
        for row in df.itertuples():
            tr.eval(run, row.key, row.samples, row.eval_loss, t=row.t)
            tr.exclude(row.boot_a, row.boot_b)
            tr.exclude(row.copy_a, row.copy_b)
        last = df.iloc[-1]
        tr.steps += int(last["samples"]) // p.batch
        tr.end(run, last["key"], "finished" if int(last["samples"]) >= full else "pruned", t=float(last["t"]))
        rss = max(rss, float(df["rss_peak_mb"].max()))
        # over the trial process once it held the base and the data, as the in-process sides
        growth = max(growth, float((df["rss_peak_mb"] - df["rss_ready_mb"]).max()))
        cuda = max(cuda, float(df["cuda_peak_mb"].max()))
    tr.peak["peak_rss_mb"] = rss
    tr.peak["rss_growth_mb"] = growth
    if p.device.startswith("cuda"):
        tr.peak["peak_cuda_mb"] = cuda
    return tr


# -- the bench -------------------------------------------------------------------------------------

def side_names(peers: list[str], only: list[str] | None = None) -> list[str]:
    """The sides for these peers, in report order (``only``: a subset; sequential always runs,
    it gives the reference loss)."""
    names = ["sequential"]
    if "optuna" in peers:
        names += ["optuna-grid-sha", "optuna-grid-median", "optuna-tpe-sha", "optuna-tpe-median"]
    if "ray-tune" in peers:
        names.append("ray-asha")
    names += ["rapidfire-sha", "rapidfire-optuna"]
    if only:
        names = [n for n in names if n == "sequential" or n in only]
    return names


def run_vs_bench(p: Preset, peers: list[str], repeats: int = 1, reduction_factor: int = 2,
                 threads: int | None = None, warmup: bool = True, only: list[str] | None = None,
                 log=print) -> dict:
    import torch

    from rapidfire_nb.bench.runners import _in_worker_thread

    if p.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"bench: preset {p.name!r} needs a CUDA GPU and none is available here")
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    import optuna  # noqa: F401  (imported before any clock starts, like every library)
    import peft
    import transformers
    import trl

    from rapidfire_nb._version import __version__

    names = side_names(peers, only)
    versions = {"rapidfire_nb": __version__, "torch": torch.__version__,
                "transformers": transformers.__version__, "trl": trl.__version__, "peft": peft.__version__,
                "optuna": optuna.__version__}
    report: dict[str, Any] = {
        "preset": asdict(p), "peers": peers, "sides": names, "repeats": repeats,
        "reduction_factor": reduction_factor,
        "space": {"learning_rate": list(PRUNER_LRS), "r": list(PRUNER_RANKS), "configs": len(space())},
        "rungs_samples": [p.steps_per_chunk * p.batch * reduction_factor ** i
                          for i in range(64) if reduction_factor ** i <= p.num_chunks],
        "machine": {"device": p.device, "torch_threads": threads, "cpu_count": os.cpu_count(),
                    "load_avg_before": os.getloadavg()},
        "versions": versions, "notes": SIDE_NOTES, "more_devices": MORE_DEVICES,
    }
    ray_started = False
    if "ray-asha" in names:
        import ray

        versions["ray"] = ray.__version__
        report["ray_start_s"], ray_started = ray_start()
    work = tempfile.mkdtemp(prefix="rfbench-vs-")
    rows: list[dict] = []
    try:
        with _quiet():
            pristine, tok = build_base(p)
            train, evald = make_datasets(p)
            specs = grid_specs(p)
            if warmup:
                log("warm-up (untimed): one short trial through TRL and through the engine...")
                wp = replace(p, steps_per_chunk=1, num_chunks=2)
                wtrain, wevald = make_datasets(wp)
                one = dict(list(grid_specs(wp).items())[:1])
                _in_worker_thread(run_sequential_side, wp, one, pristine, tok, wtrain, wevald, work)
                run_rapidfire_side(wp, "sha", pristine, tok, wtrain, wevald, work, reduction_factor)
            for rep in range(repeats):
                order = names[rep % len(names):] + names[:rep % len(names)]
                traces: dict[str, Trace] = {}
                for name in order:
                    shutil.rmtree(work, ignore_errors=True)
                    os.makedirs(work, exist_ok=True)
                    log(f"  repeat {rep + 1}/{repeats}: {name}...")
                    if name == "sequential":
                        tr = _in_worker_thread(run_sequential_side, p, specs, pristine, tok, train, evald, work)
                    elif name.startswith("optuna-"):
                        _, sampler, pruner = name.split("-")
                        tr = _in_worker_thread(run_optuna_side, p, specs, pristine, tok, train, evald,
                                               work, sampler, pruner, reduction_factor)
                    elif name == "ray-asha":
                        tr = run_ray_side(p, threads, reduction_factor, work)
                    else:
                        tr = run_rapidfire_side(p, name.split("-", 1)[1], pristine, tok, train, evald,
                                                work, reduction_factor)
                    traces[name] = tr
                full = p.steps_per_run * p.batch
                ref = summarize(traces["sequential"], None, full)["best_final_eval_loss"]
                row = {"repeat": rep, "order": order, "reference_loss": ref,
                       "sides": {n: summarize(traces[n], ref, full) for n in names},
                       "traces": {n: traces[n].to_json() for n in names}}
                row["target"] = check_target(row["sides"])
                rows.append(row)
                for n in names:
                    s = row["sides"][n]
                    log(f"    {n:<19} winner at {_fmt_s(s['t_winner_s'])}, end {s['wall_s']:.1f} s, best "
                        f"{_fmt_loss(s['best_final_eval_loss'])} ({s['winner']}), {s['steps']} steps")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if ray_started:
            # a Ray left running would read as "the user chose a cluster" to later experiments
            import ray

            ray.shutdown()
    report["per_repeat"] = rows
    report["machine"]["load_avg_after"] = os.getloadavg()
    figures = ("t_winner_s", "t_lead_s", "t_last_out_s", "t_within_1pct_s", "wall_s",
               "best_final_eval_loss", "steps", "peak_rss_mb", "rss_growth_mb", "peak_cuda_mb",
               "excluded_s")
    stats = {}
    for n in names:
        stats[n] = {}
        for f in figures:
            vals = [r["sides"][n].get(f) for r in rows]
            vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
            if vals:
                stats[n][f] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
        stats[n]["winner"] = [r["sides"][n]["winner"] for r in rows]
    report["stats"] = stats
    report["target"] = check_target({n: {k: (v["median"] if isinstance(v, dict) else None)
                                         for k, v in stats[n].items()} for n in names})
    report["peer_wins"] = peer_wins(stats, names)
    return report


def check_target(sides: dict) -> dict:
    """rapidfire-sha's time to the winner against Optuna + TRL's best pruner, at equal final loss.

    Optuna's best pruner: the Optuna side that identifies its winner soonest among those whose
    winner is within 2 % of the best final loss any Optuna side found (a fast side that found a
    worse winner does not count as "best")."""
    ours = sides.get("rapidfire-sha") or {}
    opt = {n: s for n, s in sides.items() if n.startswith("optuna-") and s.get("t_winner_s") is not None
           and s.get("best_final_eval_loss") is not None}
    if not opt or ours.get("t_winner_s") is None:
        return {"available": False}
    best_loss = min(s["best_final_eval_loss"] for s in opt.values())
    good = {n: s for n, s in opt.items() if s["best_final_eval_loss"] <= best_loss * (1 + TARGET["loss_gap"])}
    name = min(good, key=lambda n: good[n]["t_winner_s"])
    them = good[name]
    ratio = ours["t_winner_s"] / them["t_winner_s"]
    gap = (ours["best_final_eval_loss"] - them["best_final_eval_loss"]) / abs(them["best_final_eval_loss"])
    return {"available": True, "optuna_side": name, "time_ratio": ratio, "loss_gap": gap,
            "met_time": ratio <= TARGET["time_ratio"], "met_loss": gap <= TARGET["loss_gap"],
            "met": ratio <= TARGET["time_ratio"] and gap <= TARGET["loss_gap"], "targets": TARGET}


def peer_wins(stats: dict, names: list[str]) -> list[str]:
    """Each figure where a peer's median beats both rapidfire sides by more than ``WIN_MARGIN``:
    said, not hidden."""
    ours = [n for n in names if n.startswith("rapidfire-")]
    out = []
    for f, label in (("t_winner_s", "time to the winner"), ("t_within_1pct_s", "time to within 1 %"),
                     ("wall_s", "time to the end"), ("best_final_eval_loss", "best final eval loss"),
                     ("steps", "optimizer steps"), ("rss_growth_mb", "RSS growth in training"),
                     ("peak_cuda_mb", "peak CUDA memory")):
        mine = [stats[n][f]["median"] for n in ours if f in stats[n]]
        if not mine:
            continue
        for n in names:
            if n in ours or f not in stats[n]:
                continue
            v = stats[n][f]["median"]
            if v < min(mine) * (1 - WIN_MARGIN):
                out.append(f"{n} beats rapidfire on {label}: {_fmt_fig(f, v)} vs {_fmt_fig(f, min(mine))}")
    return out


def _fmt_s(v) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _fmt_loss(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _fmt_fig(f: str, v) -> str:
    if f.endswith("_s"):
        return _fmt_s(v)
    if f == "best_final_eval_loss":
        return _fmt_loss(v)
    if f.endswith("_mb"):
        return f"{v:.0f} MiB"
    return f"{v:g}"


def format_vs_report(r: dict) -> str:
    p, st = r["preset"], r["stats"]
    n_runs = r["space"]["configs"]
    lines = [
        f"rapidfire bench --vs {','.join(r['peers'])} -- preset {p['name']}: {p['description']}",
        f"  search space: {n_runs} configs, learning rate {r['space']['learning_rate']} x LoRA rank "
        f"{r['space']['r']}; per config {p['num_chunks']} chunks x {p['steps_per_chunk']} steps, batch "
        f"{p['batch']}; eval after every chunk; rungs at {r['rungs_samples']} samples, reduction factor "
        f"{r['reduction_factor']}",
        f"  {r['machine']['torch_threads']} torch threads on every side, {r['machine']['cpu_count']} CPUs; "
        f"load average before {r['machine']['load_avg_before'][0]:.2f}, after "
        f"{r['machine']['load_avg_after'][0]:.2f}; {r['repeats']} repeat(s): median [min-max]",
        "  versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()),
        "",
        "  winner = the run with the best final eval loss; 'winner at' = when it is ranked first for good "
        "AND every competitor is pruned or finished;",
        "  'within 1 %' = when any run first reaches 1.01 x the full grid's best final eval loss "
        "(sequential TRL, every config to the end)",
        "",
    ]

    def cell(name, f, fmt):
        s = st[name].get(f)
        if s is None:
            return "-"
        if s["min"] == s["max"]:
            return fmt(s["median"])
        return f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"

    sec = lambda v: f"{v:.1f}"          # noqa: E731
    cols = [("winner at s", "t_winner_s", sec), ("leads from s", "t_lead_s", sec),
            ("last out s", "t_last_out_s", sec), ("within 1% s", "t_within_1pct_s", sec),
            ("end s", "wall_s", sec), ("best loss", "best_final_eval_loss", lambda v: f"{v:.4f}"),
            ("steps", "steps", lambda v: f"{v:.0f}"),
            ("RSS growth MiB", "rss_growth_mb", lambda v: f"{v:.0f}")]
    if any("peak_cuda_mb" in st[n] for n in r["sides"]):
        cols.append(("peak CUDA MiB", "peak_cuda_mb", lambda v: f"{v:.0f}"))
    table = [["side"] + [c[0] for c in cols]]
    for n in r["sides"]:
        table.append([n] + [cell(n, f, fmt) for _, f, fmt in cols])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        lines.append("  " + "  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                                      for j, c in enumerate(row)))
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    lines.append("")
    for n in r["sides"]:
        winners = st[n]["winner"]
        lines.append(f"  {n:<19} {SIDE_NOTES[n]}; winner {', '.join(sorted(set(map(str, winners))))}")
    t = r["target"]
    lines.append("")
    if t.get("available"):
        mark = "ok  " if t["met"] else "MISS"
        lines.append(f"  [{mark}] target: rapidfire-sha identifies its winner in <= {t['targets']['time_ratio']:.0%} "
                     f"of Optuna + TRL's time with its best pruner ({t['optuna_side']}), at a best final loss "
                     f"within {t['targets']['loss_gap']:.0%}: time ratio {t['time_ratio']:.2f}, loss gap "
                     f"{100 * t['loss_gap']:+.2f} % (medians)")
    else:
        lines.append("  target: needs --vs optuna (Optuna + TRL's time to its winner)")
    if r["peer_wins"]:
        lines.append(f"  where a peer wins (medians, better than both rapidfire sides by > {WIN_MARGIN:.0%}):")
        lines += [f"    {w}" for w in r["peer_wins"]]
    else:
        lines.append("  no peer beats both rapidfire sides on any figure here (medians)")
    lines.append("  with more devices:")
    for k, v in r["more_devices"].items():
        if k in ("sequential", "rapidfire") or k in r["peers"]:
            lines.append(f"    {k}: {v}")
    if "ray_start_s" in r:
        lines.append(f"  Ray start (off every clock): {r['ray_start_s']:.1f} s; a Ray trial's process start, "
                     "imports and base build are off its clock too")
    return "\n".join(lines)


def vs_main(args) -> int:
    import json

    from rapidfire_nb.bench.report import _json_default

    peers = [x.strip() for x in args.vs.split(",") if x.strip()]
    bad = [x for x in peers if x not in PEERS]
    if bad or not peers:
        print(f"rapidfire bench: --vs takes a comma-separated list of {', '.join(PEERS)}; got "
              f"{args.vs!r}", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.reduction_factor < 2:
        print("rapidfire bench: --repeats must be >= 1 and --reduction-factor >= 2", file=sys.stderr)
        return 2
    only = [x.strip() for x in (args.sides or "").split(",") if x.strip()]
    known = side_names(peers)
    if [x for x in only if x not in known]:
        print(f"rapidfire bench: --sides names sides of {', '.join(known)}; got {args.sides!r}",
              file=sys.stderr)
        return 2
    p = vs_preset(args.preset)
    try:
        p = with_overrides(p, args, {"chunks": "num_chunks", "steps_per_chunk": "steps_per_chunk"})
    except ValueError as exc:
        print(f"rapidfire bench: {exc}", file=sys.stderr)
        return 2
    if "ray-tune" in peers:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            print("rapidfire bench: --vs ray-tune needs Ray Tune: pip install 'ray[tune]'", file=sys.stderr)
            return 2
    from rapidfire_nb._quiet import import_peft_quietly

    import_peft_quietly()
    log = (lambda *a, **k: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a, **k: print(*a, flush=True))
    log(f"rapidfire bench --vs {','.join(peers)}: preset {p.name}, {len(space())} configs x {p.num_chunks} "
        f"chunks x {p.steps_per_chunk} steps, {args.repeats} repeat(s) (timings on a busy machine are noisy)")
    report = run_vs_bench(p, peers, repeats=args.repeats, reduction_factor=args.reduction_factor,
                          threads=args.threads, warmup=not args.no_warmup, only=only or None, log=log)
    text = json.dumps(report, indent=1, default=_json_default)
    if args.output:
        from rapidfire_nb.engine import atomic_write_text

        atomic_write_text(args.output, text)   # never through a link planted at the name
    print(text if args.json else format_vs_report(report), flush=True)
    return 0
