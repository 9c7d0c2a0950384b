"""One bench: warm-up, repeats alternating which side goes first, memory, medians, targets."""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
from dataclasses import asdict, replace
from typing import Any

from rapidfire_nb.bench.memory import measure_memory
from rapidfire_nb.bench.presets import Preset, _quiet, build_base, make_datasets, make_group
from rapidfire_nb.bench.report import _median, check_targets
from rapidfire_nb.bench.runners import run_interleaved, run_sequential


def run_bench(p: Preset, repeats: int = 3, use_eval: bool = True, memory: bool = True,
              warmup: bool = True, tracking=None, threads: int | None = None, offload: str = "auto",
              checkpoints: bool = True,
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
        "checkpoints": checkpoints,
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
                                wevald if use_eval else None, work, tracking, offload, checkpoints)
                run_sequential(wp, wgroup.expand(), pristine, tok, wtrain, wevald, work, use_eval,
                               sequential_main_thread)
            rows = []
            for r in range(repeats):
                order = ("interleaved", "sequential") if r % 2 == 0 else ("sequential", "interleaved")
                row: dict[str, Any] = {"repeat": r, "order": list(order)}
                for side in order:
                    if side == "interleaved":
                        row["interleaved"] = run_interleaved(p, group, (copy.deepcopy(pristine), tok),
                                                             train, ev, work, tracking, offload,
                                                             checkpoints)
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
    med["writer"] = {k: _median(r["interleaved"][k] for r in rows)
                     for k in ("writer_busy_s", "writer_cpu_s", "writer_encode_s", "writer_jobs")}
    report["median"] = med
    if memory:
        log(f"memory: {mem_runs[0]} vs {mem_runs[1]} LoRA runs, one subprocess each...")
        report["memory"] = measure_memory(p, mem_runs, use_eval, threads)
    report["targets"] = check_targets(report)
    return report
