"""``rapidfire bench --workers N``: the same runs trained in the kernel, on 1 Ray worker, on N.

Every side trains the same group (``--configs``, default 8 LoRA runs on one base; the preset's
chunks and steps) from a fresh copy of the same base, and reports:

* ``wall_s``        ``run_fit`` to the end, start-up included (Ray workers start their Python,
                    import torch/transformers/TRL and build their trainers: seconds);
* ``startup_s``     ``run_fit`` to the start of the first chunk, measured the same way on every
                    side (the kernel's own one-off costs, run_fit's checks and TRL's import, fall
                    here too, as a worker's do); ``workers_up_s``: to the ``workers`` event;
* ``train_wall_s``  from the start of the first chunk to the end: the figure that scales with
                    the work; the report gives its ratio and the end-to-end ``wall_s`` ratio;
* ``hop_ms``        per chunk, the actor round trip less the time inside the worker (arguments and
                    result through Ray's object store, scheduling, the controller noticing);
* ``hop_frac_median`` the headline hop share, checked against ``HOP_TARGET`` (< 2 %): per chunk,
                    its hop over its time inside the worker, the median over chunks; and
                    ``hop_frac``: the sum of hops over the sum of the workers' chunk times (one
                    slow hop, e.g. a worker's first chunk, weighs more here);
* ``hop_call_ms`` / ``hop_back_ms`` / ``hop_get_ms``: the hop's parts (medians): the call reaching
                    the worker, the reply reaching the controller (pickling the snapshot, noticing),
                    ``ray.get`` (transfer, unpickling);
* ``idle_frac``     per worker, the gaps between a reply coming back and its next chunk being sent,
                    over the workers' chunk time: what the controller's own work costs the workers;
* ``moves``         runs that changed worker (each costs a trainer build and a checkpoint shipped).

Ray is started once, locally (or the cluster ``RAY_ADDRESS`` names), before anything is timed.
Each worker's torch uses as many threads as the CPUs it claims (all of them for 1 worker, half
each for 2 on this machine); the kernel side uses this process's torch threads (``--threads``).
Compare sides at equal thread counts only: on a CPU, and above all on a machine busy with other
work (load average above its cores), two or more OpenMP threads per process can collapse (threads
spin waiting for a preempted sibling; measured here: the same 8 steps 10-15x slower), whichever
side is unlucky. Each side records the load average when it started and its torch threads.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace

HOP_TARGET = 0.02   # the actor hop, as a share of a chunk's time (median over chunks)
STARTUP_NOTE = ("start-up: run_fit to the first chunk's start on every side (with workers: Ray, then the "
                "workers importing torch and loading the model); paid once per experiment, so for long "
                "sweeps compare 'after start-up', for a short one end to end")


def run_side(p, group, pristine, tok, train, evald, workdir: str, num_workers: int) -> dict:
    from rapidfire_nb.experiment import Experiment

    model = copy.deepcopy(pristine)
    exp = Experiment(f"bench-w{num_workers}-{int(time.time() * 1000)}", experiment_path=workdir,
                     tracking=[], num_workers=num_workers)
    try:
        load = os.getloadavg()[0]
        t0 = time.time()
        # run_fit's "starting N Ray workers" notice: not into the report (or --json's output)
        with contextlib.redirect_stdout(sys.stderr):
            exp.run_fit(group, lambda cfg: (model, tok), train, evald, num_chunks=p.num_chunks,
                        seed=42, block=True)
        end = time.time()
        info = exp.get_runs_info()
        bad = info[info.status != "completed"]
        if len(bad):
            raise RuntimeError("not every run completed: " + "; ".join(
                f"run {r.run_id} {r.status} {str(r.error)[-300:]}" for r in bad.itertuples()))
        evs = exp.events.since(0)
        chunks = [e for e in evs if e["type"] == "chunk_done"]
        # the same start-up on every side: up to the first chunk (a worker's start-up, and the
        # kernel's run_fit checks and first imports, all end there)
        ready = min((c["start"] for c in chunks if isinstance(c.get("start"), (int, float))), default=t0)
        ready = min(max(ready, t0), end)
        out = {"workers": num_workers, "load_avg_at_start": load, "wall_s": end - t0, "startup_s": ready - t0,
               "train_wall_s": end - ready, "chunks": len(chunks),
               "train_s": sum(c["train_s"] for c in chunks),
               "eval_s": sum(c["eval_s"] for c in chunks),
               "by_worker": {}}
        for c in chunks:
            w = c.get("worker", "kernel")
            out["by_worker"][w] = out["by_worker"].get(w, 0) + 1
        remote = exp.engine.executor
        if hasattr(remote, "hops"):   # the Ray executor keeps each chunk's round trip
            hops = remote.hops
            out["moves"] = remote.moves
            out["hop_ms_median"] = 1000 * statistics.median(h["hop_s"] for h in hops)
            out["hop_ms_max"] = 1000 * max(h["hop_s"] for h in hops)
            out["chunk_ms_median"] = 1000 * statistics.median(h["worker_s"] for h in hops)
            busy = sum(h["worker_s"] for h in hops)
            out["hop_frac"] = sum(h["hop_s"] for h in hops) / busy
            out["hop_frac_median"] = statistics.median(h["hop_s"] / h["worker_s"] for h in hops)
            for part in ("hop_call_s", "hop_back_s", "hop_get_s"):
                if all(part in h for h in hops):
                    out[part.replace("_s", "_ms")] = 1000 * statistics.median(h[part] for h in hops)
            idle = 0.0
            for w in {h["worker"] for h in hops}:
                mine = sorted((h for h in hops if h["worker"] == w), key=lambda h: h["sent"])
                idle += sum(max(0.0, b["sent"] - a["arrived"]) for a, b in zip(mine, mine[1:]))
            out["idle_frac"] = idle / busy
            # per chunk, in the order sent: where a long hop comes from (first chunk of a worker,
            # a move, a busy moment of the machine)
            t_first = min(h["sent"] for h in hops)
            out["hops"] = [{"worker": h["worker"], "run_id": h["run_id"], "moved": h["moved"],
                            "sent_s": round(h["sent"] - t_first, 3),
                            **{k: round(1000 * h[k], 2) for k in
                               ("hop_s", "worker_s", "hop_call_s", "hop_back_s", "hop_get_s") if k in h}}
                           for h in sorted(hops, key=lambda h: h["sent"])]
            (workers,) = [e for e in evs if e["type"] == "workers"]
            out["workers_up_s"] = workers["time"] - t0
            out["torch_threads"] = {w["worker"]: w["torch_threads"] for w in workers["workers"]}
        else:
            import torch

            out["torch_threads"] = {"kernel": torch.get_num_threads()}
        return out
    finally:
        exp.end()


def progress_line(side: dict, repeat: int, repeats: int) -> str:
    """One side done: which repeat (0-based ``repeat``), which side, its wall times and hop."""
    n = side["workers"]
    text = (f"  repeat {repeat + 1}/{repeats}, {'kernel' if n == 0 else f'{n} worker(s)'}: wall "
            f"{side['wall_s']:.2f} s, after start-up {side['train_wall_s']:.2f} s")
    if "hop_frac_median" in side:
        text += (f", hop {side['hop_ms_median']:.1f} ms/chunk ({100 * side['hop_frac_median']:.2f} % of "
                 f"a chunk's time, median), moves {side['moves']}")
    return text


def run_workers_bench(p, workers: int, repeats: int = 1, log=print) -> dict:
    import torch

    from rapidfire_nb.bench.presets import _quiet, build_base, make_datasets, make_group
    from rapidfire_nb.engine import connect

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t0 = time.perf_counter()
    ray = connect()
    report = {"preset": asdict(p), "workers": workers, "repeats": repeats,
              "ray_version": ray.__version__, "ray_start_s": time.perf_counter() - t0,
              "cluster": {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")},
              "cpu_count": os.cpu_count(), "kernel_torch_threads": torch.get_num_threads(),
              "load_avg_before": os.getloadavg(), "sides": []}
    sides = [0, 1, workers] if workers > 1 else [0, workers]
    work = tempfile.mkdtemp(prefix="rapidfire-bench-workers-")
    try:
        with _quiet():
            pristine, tok = build_base(p)
            train, evald = make_datasets(p)
            group = make_group(p, p.n_configs)
            for r in range(repeats):
                order = sides if r % 2 == 0 else list(reversed(sides))
                for n in order:
                    side = run_side(p, group, pristine, tok, train, evald, work, n)
                    side["repeat"] = r
                    report["sides"].append(side)
                    log(progress_line(side, r, repeats))
                    shutil.rmtree(work, ignore_errors=True)
                    os.makedirs(work, exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_avg_after"] = os.getloadavg()
    med = {}
    for n in sides:
        mine = [s for s in report["sides"] if s["workers"] == n]
        key = "kernel" if n == 0 else f"workers_{n}"
        med[key] = {k: statistics.median(s[k] for s in mine)
                    for k in ("wall_s", "train_wall_s", "startup_s", "workers_up_s", "hop_ms_median",
                              "hop_frac", "hop_frac_median", "hop_call_ms", "hop_back_ms", "hop_get_ms", "idle_frac",
                              "load_avg_at_start")
                    if k in mine[0]}
        med[key]["torch_threads"] = mine[0]["torch_threads"]
    report["median"] = med
    return report


def format_workers_report(r: dict) -> str:
    p, med = r["preset"], r["median"]
    lines = [f"rapidfire bench --workers {r['workers']}: preset {p['name']}, {p['n_configs']} runs x "
             f"{p['num_chunks']} chunks x {p['steps_per_chunk']} steps; Ray {r['ray_version']} "
             f"(cluster {r['cluster']}, started in {r['ray_start_s']:.1f} s, not timed); "
             f"{r['cpu_count']} CPUs, load average {r['load_avg_before'][0]:.1f} before / "
             f"{r['load_avg_after'][0]:.1f} after (a busy machine slows every side)",
             f"  {'side':<12} {'wall s':>8} {'start-up s':>11} {'after start-up s':>17} {'hop ms':>8} "
             f"{'hop %':>7}  {'hop % target':<14} {'sum hops/sum chunks':>19}"]
    for key, m in med.items():
        if "hop_frac_median" in m:
            mark = "[ok  ]" if m["hop_frac_median"] < HOP_TARGET else "[MISS]"
            hop = (f"{m['hop_ms_median']:8.1f} {100 * m['hop_frac_median']:6.2f}%  "
                   f"{mark + f' < {100 * HOP_TARGET:g} %':<14} {100 * m['hop_frac']:18.2f}%")
        else:
            hop = f"{'-':>8} {'-':>7}  {'':<14} {'-':>19}"
        lines.append(f"  {key:<12} {m['wall_s']:8.2f} {m['startup_s']:11.2f} {m['train_wall_s']:17.2f} {hop}")
    kern, kern_wall = med["kernel"]["train_wall_s"], med["kernel"]["wall_s"]
    for key, m in med.items():
        if key != "kernel":
            lines.append(f"  {key}: {kern / m['train_wall_s']:.2f}x the kernel engine's speed after start-up "
                         f"(from the first chunk on); {kern_wall / m['wall_s']:.2f}x end to end (start-up "
                         "included)")
    lines.append(f"  {STARTUP_NOTE}")
    for key, m in med.items():
        if "hop_call_ms" in m:
            lines.append(f"  {key} hop parts (median ms): call {m['hop_call_ms']:.1f}, back "
                         f"{m['hop_back_ms']:.1f}, get {m['hop_get_ms']:.1f}; workers idle between "
                         f"chunks {100 * m['idle_frac']:.2f} % of chunk time")
    lines.append("  torch threads: " + "; ".join(
        f"{key} {sorted(m['torch_threads'].values())} (load {m['load_avg_at_start']:.1f} at its start)"
        for key, m in med.items()))
    if any(m["load_avg_at_start"] > r["cpu_count"] and max(m["torch_threads"].values()) > 1
           for m in med.values()):
        lines.append(f"  note: the load average exceeded the {r['cpu_count']} CPUs during the bench: "
                     "sides with 2+ torch threads per process may have collapsed from "
                     "oversubscription (OpenMP threads spinning on preempted siblings); compare "
                     "wall times only at equal thread counts on an idle machine, or rerun with "
                     "--threads 1 (the kernel and every worker then use one torch thread)")
    lines.append("  hop ms: the actor round trip less the time inside the worker, per chunk (median); "
                 f"hop %: per chunk, its hop over its time, the median over chunks (target < "
                 f"{100 * HOP_TARGET:g} %: [ok  ] met, [MISS] not met on this machine in this run); "
                 "sum hops/sum chunks: all hops over all chunk time (a slow first chunk weighs more)")
    return "\n".join(lines)


def workers_main(args, preset) -> int:
    p = preset
    if args.configs is None:
        p = replace(p, n_configs=8)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
        # the workers too: sides compare at equal thread counts (see the module docstring)
        os.environ["RAPIDFIRE_WORKER_THREADS"] = str(args.threads)
    log = (lambda *a, **k: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a, **k: print(*a, flush=True))
    log(f"rapidfire bench --workers {args.workers}: {p.n_configs} runs in the kernel, on 1 worker"
        + (f" and on {args.workers}" if args.workers > 1 else "") + "...")
    report = run_workers_bench(p, args.workers, repeats=args.repeats, log=log)
    text = json.dumps(report, indent=1, default=str)
    if args.output:
        from rapidfire_nb.engine import atomic_write_text

        atomic_write_text(args.output, text)   # never through a link planted at the name
    print(text if args.json else format_workers_report(report), flush=True)
    return 0
