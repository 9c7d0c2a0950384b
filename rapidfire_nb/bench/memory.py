"""Peak memory of an experiment with 1 run vs N, each measured in a fresh subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace

from rapidfire_nb.bench.presets import Preset, _quiet, build_base, make_datasets, make_group
from rapidfire_nb.bench.runners import run_interleaved


MEM_PROBE_TAG = "RFBENCH_MEM "


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
               "import sys; from rapidfire_nb.bench.memory import _mem_probe_main; "
               "sys.exit(_mem_probe_main(sys.argv[1:]))",
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
