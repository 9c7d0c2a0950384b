"""``rapidfire bench``'s arguments and entry point (``python -m rapidfire_nb.bench`` too)."""

from __future__ import annotations

import argparse
import json
import sys

from rapidfire_nb.bench.presets import LEARNING_RATES, PRESETS, with_overrides
from rapidfire_nb.bench.pruner import _pruner_main
from rapidfire_nb.bench.report import _json_default, format_report
from rapidfire_nb.bench.run import run_bench


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
                    help="cpu: ~4.5M-param Llama, fp32 (default); launch: hidden 64 x 22 layers on 1 "
                         "thread, 16 chunks x 2 steps, eval off, where a step is mostly host work "
                         "(the GPU's launch-bound regime); tinyllama: 1.1B-shaped, bf16, CUDA; "
                         "vs: tinyllama's shape at 256 tokens, 8 chunks x 2 steps, for --vs on a GPU; "
                         "smoke: seconds, numbers mean nothing")
    ap.add_argument("--repeats", type=int, default=3, help="repeats (medians are reported); default 3")
    ap.add_argument("--configs", type=int, default=None, help="number of LoRA configs (default: preset's)")
    ap.add_argument("--chunks", type=int, default=None, help="chunks per run (default: preset's)")
    ap.add_argument("--steps-per-chunk", type=int, default=None, help="optimizer steps per chunk")
    ap.add_argument("--device", default=None, help="override the preset's device (cpu, cuda)")
    ap.add_argument("--eval", choices=("both", "none"), default=None,
                    help="both: the same eval after every chunk on both sides (default; the launch "
                         "preset: none); none: no eval")
    ap.add_argument("--no-memory", action="store_true", help="skip the 1-vs-8-run memory probes")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's; the launch preset: 1)")
    ap.add_argument("--no-checkpoints", action="store_true",
                    help="measuring only: the engine side writes no chunk checkpoints (its log and "
                         "snapshots stay), to size the writes' share of the time; not a mode "
                         "anything else can run in")
    ap.add_argument("--offload", choices=("auto", "always", "never"), default="auto",
                    help="the engine's Experiment(offload=...): 'always' parks every idle run in host "
                         "memory, to measure what a swap costs when runs do not fit on the device")
    ap.add_argument("--tracking", default="", help="comma-separated trackers for the engine side "
                                                   "(default none)")
    ap.add_argument("--sequential-main-thread", action="store_true",
                    help="run the TRL baseline in the main thread (default: a worker thread, like "
                         "the engine's training thread)")
    ap.add_argument("--pruner", choices=("sha", "median", "hyperband"), default=None,
                    help="run the pruning comparison instead: an 8-config grid (4 learning rates x 2 "
                         "LoRA ranks) trained in full and with this pruner; best final eval loss and wall time of each")
    ap.add_argument("--reduction-factor", type=int, default=2,
                    help="with --pruner or --vs: keep 1/N per rung")
    ap.add_argument("--vs", default=None, metavar="PEERS",
                    help="time to the winner beside what users run instead: 'optuna', 'ray-tune' or "
                         "both ('optuna,ray-tune'): the same 8 configs (4 learning rates x 2 LoRA ranks) "
                         "with plain sequential TRL, Optuna + TRL (grid and TPE samplers; successive "
                         "halving and median pruners), Ray Tune + TRL (ASHA) and rapidfire_nb (SHA, "
                         "RFOptuna); per side: when the winner is identified, when a run is within 1 %% "
                         "of the best loss, best final loss, optimizer steps, peak memory. With the cpu "
                         "preset about 4 minutes per repeat on 2 busy CPU cores (default --repeats 3)")
    ap.add_argument("--sides", default=None,
                    help="with --vs: only these sides (comma-separated, e.g. 'optuna-grid-sha,"
                         "rapidfire-sha'); plain sequential TRL always runs (it gives the reference loss)")
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
    if args.vs is not None:   # against Optuna + TRL and Ray Tune + TRL (rapidfire_nb/bench/vs.py)
        from rapidfire_nb.bench.vs import vs_main

        return vs_main(args)   # checks its arguments before loading the ML libraries
    from rapidfire_nb._quiet import import_peft_quietly

    # after parsing, so --help and a bad option answer at once; before anything imports peft
    import_peft_quietly()
    if args.pruner:   # a pruned grid against the full one (run_pruner_bench)
        return _pruner_main(args)
    p = PRESETS[args.preset]
    if args.workers is not None and args.workers < 1:
        print(f"rapidfire bench: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    try:
        p = with_overrides(p, args, {"configs": "n_configs", "chunks": "num_chunks",
                                     "steps_per_chunk": "steps_per_chunk"})
    except ValueError as exc:
        print(f"rapidfire bench: {exc}", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"rapidfire bench: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if not 1 <= p.n_configs <= len(LEARNING_RATES):
        print(f"rapidfire bench: --configs must be between 1 and {len(LEARNING_RATES)}, got "
              f"{p.n_configs}", file=sys.stderr)
        return 2
    if args.workers:   # kernel vs Ray workers (rapidfire_nb/bench/workers.py)
        from rapidfire_nb.bench.workers import workers_main

        return workers_main(args, p)
    tracking = [t.strip() for t in args.tracking.split(",") if t.strip()]
    log = (lambda *a, **k: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a, **k: print(*a, flush=True))
    log(f"rapidfire bench: preset {p.name}, {p.n_configs} configs x {p.num_chunks} chunks x "
        f"{p.steps_per_chunk} steps, {args.repeats} repeat(s)...")
    use_eval = p.eval if args.eval is None else args.eval == "both"
    report = run_bench(p, repeats=args.repeats, use_eval=use_eval,
                       memory=not args.no_memory, warmup=not args.no_warmup, tracking=tracking,
                       offload=args.offload, checkpoints=not args.no_checkpoints,
                       threads=args.threads or p.threads, sequential_main_thread=args.sequential_main_thread,
                       log=log)
    text = json.dumps(report, indent=1, default=_json_default)
    if args.output:
        from rapidfire_nb.engine import atomic_write_text

        atomic_write_text(args.output, text)   # never through a link planted at the name
    print(text if args.json else format_report(report), flush=True)
    return 0
