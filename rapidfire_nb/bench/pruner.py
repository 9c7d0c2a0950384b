"""``rapidfire bench --pruner sha``: does pruning at chunk boundaries find the same best run, faster?"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace

from rapidfire_nb.bench.presets import PRESETS, Preset, _quiet, _sync, build_base, make_datasets, training_kwargs
from rapidfire_nb.bench.report import _json_default


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
        from rapidfire_nb.engine import atomic_write_text

        atomic_write_text(args.output, text)   # never through a link planted at the name
    print(text if args.json else format_pruner_report(report), flush=True)
    return 0
