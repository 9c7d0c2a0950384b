"""The bench's targets, the check against them, and the human-readable report."""

from __future__ import annotations

import math
import statistics



TARGETS = {"ratio": 1.03, "overhead": 0.03, "memory_ratio": 1.15, "first_all_slack": 0.05}


def _median(values):
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else math.nan


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
        _writer_line(report),
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


def _writer_line(report: dict) -> str:
    """The checkpoint writer thread's share, beside the training threads' step times."""
    w = report["median"].get("writer")
    if not w:
        return "  checkpoint writer: not measured"
    if report.get("checkpoints") is False:
        return "  checkpoint writer: checkpoints off (--no-checkpoints, measuring only)"
    jobs = w["writer_jobs"] or 0
    per = 1000 * w["writer_busy_s"] / jobs if jobs else math.nan
    return (f"  checkpoint writer busy {w['writer_busy_s']:.2f} s ({jobs:.0f} checkpoints, "
            f"{per:.1f} ms each); its CPU time {w['writer_cpu_s']:.2f} s (the most it can have held "
            f"the interpreter), of which encoding {w['writer_encode_s']:.2f} s")


def _json_default(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return str(obj)
