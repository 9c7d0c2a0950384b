"""The measurements of the GPU check, one per section; ``tests/gpu/run`` starts each in its own
process (``python sections.py NAME PARAMS_JSON RESULT_PATH``), so a CUDA error, an out-of-memory
or a hang in one of them cannot take the others down, and each starts with clean peak-memory
counters.

Every section trains through the product (``Experiment.run_fit`` over an ``RFGridSearch``, or the
``rapidfire bench`` command line) on Llama-architecture models with random weights built from a
config (no hub). Sizes come from ``PARAMS``: ``tests/gpu/run`` passes GPU sizes, or tiny CPU sizes
for its dry run. CUDA-only measurements check ``torch.cuda.is_available()`` and record what they
skipped instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# -- building blocks -----------------------------------------------------------------------------

def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def model_factory(model: dict, device: str):
    """A ``create_model`` that builds the same random-initialised Llama every time it is called
    (seeded, the caller's RNG left as it was), directly on ``device`` in ``model["dtype"]``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapidfire_nb import demo_data

    def create_model(model_config: dict):
        tok = demo_data.make_tokenizer()
        seq = int(model.get("seq_len") or 0)
        tok.model_max_length = max(tok.model_max_length, seq)
        config = LlamaConfig(
            vocab_size=model.get("vocab") or len(tok), hidden_size=model["hidden"],
            intermediate_size=model["intermediate"], num_hidden_layers=model["layers"],
            num_attention_heads=model["heads"], num_key_value_heads=model.get("kv_heads", model["heads"]),
            max_position_embeddings=max(512, seq), pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if _cuda() else []):
            torch.manual_seed(0)
            with torch.device(device):
                m = LlamaForCausalLM(config).to(_dtype(model.get("dtype", "float32")))
        m.generation_config.pad_token_id = tok.pad_token_id
        return m, tok

    return create_model


def n_params(create_model) -> int:
    m, _ = create_model({})
    n = sum(p.numel() for p in m.parameters())
    del m
    return n


def datasets_for(p: dict):
    """Train/eval sets: the demo prompt/completion task, or (``seq_len`` given) random-word texts
    that truncation cuts to exactly ``seq_len`` tokens, a fixed batch shape."""
    import random

    from datasets import Dataset

    from rapidfire_nb import demo_data

    n_train = p["batch"] * p["steps_per_chunk"] * p["num_chunks"]
    seq = p["model"].get("seq_len")
    if not seq:
        return demo_data.make_demo_datasets(n_train, p["n_eval"], seed=0)
    words = demo_data.WORDS + demo_data.ANIMALS + demo_data.COLORS
    rng = random.Random(0)

    def rows(n):
        return [{"text": " ".join(rng.choice(words) for _ in range(seq))} for _ in range(n)]

    return Dataset.from_list(rows(n_train)), Dataset.from_list(rows(p["n_eval"]))


def make_group(p: dict, lrs: list[float], precision: str):
    """LoRA configs on one base, one per learning rate (run 1 has ``lrs[0]``)."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    kw = dict(per_device_train_batch_size=p["batch"], per_device_eval_batch_size=p["batch"],
              num_train_epochs=1, lr_scheduler_type="linear", warmup_steps=1,
              gradient_checkpointing=False, dataloader_num_workers=0,
              bf16=precision == "bf16", fp16=precision == "fp16",
              max_length=p["model"].get("seq_len") or 64)
    lora = RFLoraConfig(r=p["lora_r"], lora_alpha=2 * p["lora_r"], lora_dropout=p.get("lora_dropout", 0.05),
                        target_modules=list(p["lora_targets"]))
    cfg = RFModelConfig(model_name=f"gpu-check-{p['model']['hidden']}x{p['model']['layers']}",
                        peft_config=lora,
                        training_args=RFSFTConfig(learning_rate=List(lrs) if len(lrs) > 1 else lrs[0], **kw))
    return RFGridSearch(cfg, trainer_type="SFT")


def _losses(exp, run_id: int, split: str, metric: str) -> list[tuple[int, float]]:
    df = exp.get_results()
    sel = df[(df.run_id == run_id) & (df.split == split) & (df.metric == metric)]
    return [(int(s), float(v)) for s, v in zip(sel.step, sel.value)]


def _scaler_state(exp, run_id: int):
    """The grad scaler state saved with the run's last chunk-boundary checkpoint (None: no scaler)."""
    ckpt = exp.store.load_checkpoint(run_id)
    state = (ckpt or {}).get("trainer", {}).get("scaler")
    if not state:
        return None
    return {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in state.items()
            if isinstance(v, (int, float, bool))}


def train(p: dict, lrs: list[float], precision: str, workdir: Path, name: str, offload: str = "auto",
          create_model=None, settle_writes: bool = False) -> dict:
    """One experiment through the Experiment API; its runs' weights, losses, scaler states and the
    engine's timeline. ``settle_writes``: every chunk waits for the checkpoint writer first (see
    ``settled_writes``)."""
    from rapidfire_nb import Experiment

    create_model = create_model or model_factory(p["model"], p["device"])
    train_ds, eval_ds = datasets_for(p)
    exp = Experiment(name, experiment_path=workdir, tracking=[], offload=offload)
    try:
        t0 = time.time()
        with settled_writes(settle_writes):
            exp.run_fit(make_group(p, lrs, precision), create_model, train_ds, eval_ds,
                        num_chunks=p["num_chunks"], seed=7, block=True)
        wall = time.time() - t0
        info = exp.get_runs_info()
        rids = [int(r) for r in info.run_id]
        out = {
            "wall_s": wall,
            "status": {r: s for r, s in zip(rids, info.status)},
            "errors": {int(r): str(e)[-1500:] for r, e in zip(info.run_id, info.error) if e},
            "weights": {r: exp.engine.run_weights(r) for r in rids},
            "train_loss": {r: _losses(exp, r, "train", "loss") for r in rids},
            "eval_loss": {r: _losses(exp, r, "eval", "eval_loss") for r in rids},
            "scaler": {r: _scaler_state(exp, r) for r in rids},
            "timeline": exp.get_timeline(),
            "parks_done": getattr(getattr(exp.engine.executor, "residency", None), "parks_done", None),
        }
    finally:
        exp.end()
    return out


@contextlib.contextmanager
def settled_writes(on: bool):
    """While on, every chunk starts once the checkpoint writer has nothing in flight.

    The engine leaves a run resident while its checkpoint is still being written (the snapshot
    holds its optimizer state by reference), so how many runs ``offload="always"`` parks depends
    on whether the writer finished before the next chunk began: on a loaded machine it may park
    none. Waiting for the writer (outside the engine's timings: before ``train_chunk`` starts its
    clock) makes every idle run park at every swap, so the parks and their timings are the same
    from one run of the check to the next."""
    if not on:
        yield
        return
    import weakref

    from rapidfire_nb.engine.executor import LocalChunkExecutor
    from rapidfire_nb.engine.writer import CheckpointWriter

    writers: weakref.WeakSet = weakref.WeakSet()
    submit, train_chunk = CheckpointWriter.submit, LocalChunkExecutor.train_chunk

    def noted_submit(self, *a, **k):
        writers.add(self)
        return submit(self, *a, **k)

    def settled_train_chunk(self, *a, **k):
        for writer in list(writers):
            writer.flush()   # the engine thread, outside the engine lock (the jobs take it)
        return train_chunk(self, *a, **k)

    CheckpointWriter.submit, LocalChunkExecutor.train_chunk = noted_submit, settled_train_chunk
    try:
        yield
    finally:
        CheckpointWriter.submit, LocalChunkExecutor.train_chunk = submit, train_chunk


def compare_weights(a: dict, b: dict) -> dict:
    import torch

    if not a or not b:
        return {"compared": 0, "bitwise": False, "max_abs_diff": None, "missing": "weights"}
    keys = sorted(set(a) | set(b))
    missing = [k for k in keys if k not in a or k not in b]
    worst, equal = 0.0, not missing
    for k in keys:
        if k in a and k in b:
            x, y = a[k].detach().cpu(), b[k].detach().cpu()
            equal = equal and x.dtype == y.dtype and torch.equal(x, y)
            worst = max(worst, float((x.double() - y.double()).abs().max()) if x.numel() else 0.0)
    return {"compared": len(keys) - len(missing), "bitwise": bool(equal), "max_abs_diff": worst,
            "missing": missing[:5]}


def compare_losses(a: list, b: list) -> dict:
    steps_a, steps_b = [s for s, _ in a], [s for s, _ in b]
    if steps_a != steps_b:
        return {"points": min(len(a), len(b)), "bitwise": False, "max_abs_diff": None,
                "steps_differ": [steps_a[:10], steps_b[:10]]}
    finite = all(math.isfinite(v) for _, v in a + b)
    diffs = [abs(x - y) for (_, x), (_, y) in zip(a, b)]
    return {"points": len(a), "bitwise": bool(a) and all(x == y for (_, x), (_, y) in zip(a, b)),
            "max_abs_diff": (max(diffs) if diffs else None) if finite else None, "finite": finite}


def alone_vs_among(p: dict, precision: str, workdir: Path, tag: str) -> dict:
    """Run 1 (the first learning rate) trained alone, and again interleaved with the others."""
    lrs = list(p["lrs"])
    alone = train(p, lrs[:1], precision, workdir, f"{tag}-alone")
    among = train(p, lrs, precision, workdir, f"{tag}-among")
    statuses = {"alone": alone["status"], "among": among["status"]}
    errors = {k: v for k, v in (("alone", alone["errors"]), ("among", among["errors"])) if v}
    train_loss = among["train_loss"].get(1, [])
    return {
        "precision": precision,
        "runs_among": len(lrs),
        "all_completed": all(s == "completed" for st in statuses.values() for s in st.values()),
        "status": statuses,
        "errors": errors,
        "weights": compare_weights(alone["weights"].get(1) or {}, among["weights"].get(1) or {}),
        "train_loss": compare_losses(alone["train_loss"].get(1, []), train_loss),
        "eval_loss": compare_losses(alone["eval_loss"].get(1, []), among["eval_loss"].get(1, [])),
        "loss_first_last": [train_loss[0][1], train_loss[-1][1]] if train_loss else None,
        "grad_scaler": {"alone": alone["scaler"].get(1), "among": among["scaler"]},
        "swaps_among": int(len(among["timeline"])),
        "wall_s": {"alone": alone["wall_s"], "among": among["wall_s"]},
    }


# -- sections ------------------------------------------------------------------------------------

def section_env(p: dict, work: Path) -> dict:
    """Versions, the device, and whether the carried wheels import and their needs are met."""
    import platform
    from importlib import metadata

    out = {"python": sys.version.split()[0], "executable": sys.executable,
           "glibc": "-".join(platform.libc_ver()), "machine": platform.machine()}
    versions = {}
    for dist in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers",
                 "safetensors", "huggingface_hub", "numpy", "pandas", "pyarrow", "fsspec", "dill",
                 "multiprocess", "xxhash", "psutil", "ray"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    out["versions"] = versions
    target = p.get("target")
    carried = {}
    if target and Path(target).is_dir():
        for info in sorted(Path(target).glob("*.dist-info")):
            dist = metadata.Distribution.at(info)
            name = dist.metadata["Name"]
            found = metadata.distribution(name)
            entry = {"version": dist.version,
                     "resolved_from_target": Path(str(found.locate_file(""))).resolve() == Path(target).resolve(),
                     "unmet": unmet_requirements(dist)}
            tops = (dist.read_text("top_level.txt") or "").split() or _tops_from_record(dist)
            entry["imports"] = {}
            for top in tops:
                try:
                    __import__(top)
                    entry["imports"][top] = "ok"
                except Exception as exc:
                    entry["imports"][top] = f"{type(exc).__name__}: {exc}"[:300]
            carried[name] = entry
    out["carried"] = carried
    import torch

    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        out["device"] = {"name": props.name, "capability": list(torch.cuda.get_device_capability(0)),
                         "memory_gib": props.total_memory / 2**30, "count": torch.cuda.device_count(),
                         "bf16": bool(torch.cuda.is_bf16_supported()), "cuda_runtime": torch.version.cuda}
    try:
        from rapidfire_nb._compat import unsupported, installed_versions

        out["rapidfire_version_problems"] = unsupported(installed_versions())
        import rapidfire_nb

        out["rapidfire_nb"] = {"version": rapidfire_nb.__version__, "path": str(Path(rapidfire_nb.__file__).parent)}
    except Exception as exc:
        out["rapidfire_nb"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def unmet_requirements(dist) -> list[str]:
    """The distribution's needs (extras aside) that this interpreter does not satisfy."""
    from importlib import metadata

    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(f"{req} (missing)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{req} (have {have})")
    return out


def _tops_from_record(dist) -> list[str]:
    tops = set()
    for f in dist.files or []:
        first = f.parts[0]
        if f.suffix == ".py" and not first.endswith((".dist-info", ".data")) and first != "..":
            tops.add(first[:-3] if first.endswith(".py") else first)
    return sorted(tops)


def section_exactness(p: dict, work: Path) -> dict:
    """Run 1 alone vs among three others, in fp32: default kernels, then deterministic algorithms
    (``torch.use_deterministic_algorithms(True, warn_only=True)``; ``run`` set
    ``CUBLAS_WORKSPACE_CONFIG`` for this process, as torch asks), the latter only where the
    default kernels differed when ``p["deterministic"]`` is ``"if_default_differs"``."""
    import torch

    out = {"device": p["device"], "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    for mode in ("default", "deterministic"):
        if mode == "deterministic" and p.get("deterministic") == "if_default_differs" and \
                out["default"]["weights"]["bitwise"] and out["default"]["train_loss"]["bitwise"]:
            # it tells a nondeterministic kernel from an engine fault; with no difference to
            # explain, its time goes to the sections after this one
            out[mode] = {"skipped": "the default kernels were bitwise identical already"}
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if mode == "deterministic":
                torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                res = alone_vs_among(p, "fp32", work, f"exact-{mode}")
            finally:
                torch.use_deterministic_algorithms(False)
        if mode == "deterministic":
            msgs = sorted({str(w.message)[:200] for w in caught if "deterministic" in str(w.message)})
            res["nondeterministic_op_warnings"] = msgs[:5]
        out[mode] = res
    return out


def section_precision(p: dict, work: Path) -> dict:
    """fp16 (as on a T4: autocast plus accelerate's grad scaler, whose state is saved with every
    chunk-boundary checkpoint and restored when the run comes back) and bf16, each as run 1 alone
    vs among three others. On a CPU the engine runs an fp16 config in fp32 (no scaler)."""
    out = {"device": p["device"]}
    for precision in ("fp16", "bf16"):
        res = alone_vs_among(p, precision, work, f"prec-{precision}")
        res["scaler_in_use"] = res["grad_scaler"]["alone"] is not None
        out[precision] = res
    if not _cuda():
        out["note"] = "no CUDA: the fp16 configs ran in fp32 (the engine's CPU policy), no grad scaler"
    return out


def section_offload(p: dict, work: Path) -> dict:
    """The same runs with every idle run parked in (pinned) host memory (``offload="always"``) and
    with all resident (``"never"``): weights and losses compared bitwise; the engine's ms per swap
    against a plain copy of the same bytes each way (pinned host <-> device when CUDA is here)."""
    from rapidfire_nb.engine.adapters.base import RunTrainer

    lrs = list(p["lrs"])
    moves: dict[str, list[tuple[int, float]]] = {"park": [], "unpark": []}

    def observed(kind, method):   # the engine's own park/unpark, timed and their bytes noted
        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            n = method(self, *a, **k)
            if n:
                moves[kind].append((n, 1000 * (time.perf_counter() - t0)))
            return n
        return wrapper

    create_model = model_factory(p["model"], p["device"])
    never = train(p, lrs, p["precision"], work, "offload-never", offload="never", create_model=create_model,
                  settle_writes=True)
    originals = RunTrainer.park, RunTrainer.unpark
    RunTrainer.park, RunTrainer.unpark = observed("park", originals[0]), observed("unpark", originals[1])
    try:
        always = train(p, lrs, p["precision"], work, "offload-always", offload="always",
                       create_model=create_model, settle_writes=True)
    finally:
        RunTrainer.park, RunTrainer.unpark = originals
    weights = {r: compare_weights(never["weights"].get(r) or {}, always["weights"].get(r) or {})
               for r in never["weights"]}
    losses = {r: compare_losses(never["train_loss"].get(r, []), always["train_loss"].get(r, []))
              for r in never["train_loss"]}

    def swap_stats(tl):
        later = tl[tl["chunk"] > 0] if len(tl) else tl   # a run's first chunk brings nothing back
        ms = [1000 * float(v) for v in later["swap_s"]] if len(later) else []
        return {"median_ms": statistics.median(ms) if ms else None, "max_ms": max(ms) if ms else None,
                "swaps": len(ms)}

    run_bytes = max((n for n, _ in moves["park"]), default=0)
    out = {
        "device": p["device"], "precision": p["precision"], "runs": len(lrs),
        "model_params": n_params(create_model),
        "all_completed": all(s == "completed" for d in (never, always) for s in d["status"].values()),
        "errors": {k: d["errors"] for k, d in (("never", never), ("always", always)) if d["errors"]},
        "bitwise_weights": all(w["bitwise"] for w in weights.values()),
        "bitwise_losses": all(x["bitwise"] for x in losses.values()),
        "weights": weights, "train_loss": losses,
        "parks_done": {"never": never["parks_done"], "always": always["parks_done"]},
        "bytes_per_parked_run": run_bytes,
        "parks": len(moves["park"]), "unparks": len(moves["unpark"]),
        "park_ms_median": statistics.median(ms for _, ms in moves["park"]) if moves["park"] else None,
        "unpark_ms_median": statistics.median(ms for _, ms in moves["unpark"]) if moves["unpark"] else None,
        "swap": {"never": swap_stats(never["timeline"]), "always": swap_stats(always["timeline"])},
    }
    out["reference"] = copy_reference(run_bytes, p.get("bandwidth_bytes", 0))
    ref_ms = out["reference"].get("same_bytes_round_trip_ms")
    eng_ms = out["swap"]["always"]["median_ms"]
    out["swap_vs_reference"] = eng_ms / ref_ms if ref_ms and eng_ms is not None else None
    return out


def copy_reference(nbytes: int, big: int) -> dict:
    """What moving ``nbytes`` costs with one plain copy each way: pinned host -> device and back on
    CUDA (a park moves the previous run out, an unpark this one in: one of each per swap); a host
    memcpy otherwise. ``big`` bytes once more for the link's bandwidth."""
    import torch

    if nbytes <= 0:
        return {"skipped": "no run was parked, nothing to compare"}
    reps = 10

    def timed(fn) -> float:
        fn()
        if _cuda():
            torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            if _cuda():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)

    if not _cuda():
        src = torch.empty(nbytes, dtype=torch.uint8)
        ms = timed(lambda: src.clone())
        return {"kind": "host memcpy (no CUDA here)", "bytes": nbytes, "same_bytes_round_trip_ms": 2 * ms,
                "pinned": "skipped: no CUDA"}
    out = {"kind": "pinned host <-> cuda:0, one tensor each way", "bytes": nbytes}
    for label, size in (("same", nbytes), ("big", big)):
        if size <= 0:
            continue
        h2d, d2h = _pinned_copy_ms(size, timed)
        out[f"{label}_bytes_h2d_ms"], out[f"{label}_bytes_d2h_ms"] = h2d, d2h
        out[f"{label}_bytes_h2d_gb_s"] = size / h2d / 1e6
        out[f"{label}_bytes_d2h_gb_s"] = size / d2h / 1e6
        if label == "same":
            out["same_bytes_round_trip_ms"] = h2d + d2h
    torch.cuda.empty_cache()
    return out


def _pinned_copy_ms(size: int, timed) -> tuple[float, float]:
    import torch

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    return (timed(lambda: dev.copy_(host, non_blocking=True)),
            timed(lambda: host.copy_(dev, non_blocking=True)))


def section_memory(p: dict, work: Path) -> dict:
    """Peak memory of one experiment with ``p["runs"]`` resident LoRA runs (``offload="never"``)
    on one shared base: ``torch.cuda.max_memory_allocated`` on CUDA, the RSS high-water mark on CPU."""
    import resource

    import torch

    create = model_factory(p["model"], p["device"])
    base = create({})
    cuda = p["device"].startswith("cuda") and _cuda()
    if cuda:
        torch.cuda.synchronize()
        base_alloc = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    params = sum(t.numel() for t in base[0].parameters())
    lrs = [1e-3 / (i + 1) for i in range(p["runs"])]
    res = train(p, lrs, p["precision"], work, f"memory-{p['runs']}", offload="never",
                create_model=lambda cfg: base)
    out = {"runs": p["runs"], "model_params": params, "precision": p["precision"],
           "all_completed": all(s == "completed" for s in res["status"].values()),
           "errors": res["errors"], "parks_done": res["parks_done"], "wall_s": res["wall_s"],
           "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if cuda:
        out["cuda_base_mb"] = base_alloc / 2**20
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["cuda_reserved_peak_mb"] = torch.cuda.max_memory_reserved() / 2**20
        out["measure"] = "torch.cuda.max_memory_allocated"
    else:
        out["measure"] = "process RSS high-water mark (no CUDA)"
    return out


def section_ray(p: dict, work: Path) -> dict:
    """Two Ray workers through ``rapidfire bench --workers 2``, if Ray is importable here."""
    try:
        import ray
    except ImportError as exc:
        return {"skipped": True, "importable": False,
                "reason": f"Ray is not installed here ({exc}); " + p.get("not_carried_reason", "")}
    out = {"importable": True, "version": ray.__version__}
    if not p.get("run_workers"):
        out.update(skipped=True, reason=p.get("skip_reason", "not asked to start workers"))
        return out
    res = run_cli(["bench", *p["bench_args"]], work, p["timeout_s"])
    out.update(res)
    out["skipped"] = False
    return out


def run_cli(argv: list[str], work: Path, timeout: float) -> dict:
    """``python -m rapidfire_nb ARGV --json --output FILE``; the JSON it wrote, or its error."""
    dest = work / f"cli-{int(time.time() * 1000)}.json"
    cmd = [sys.executable, "-m", "rapidfire_nb", *argv, "--json", "--output", str(dest)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=work)
    out = {"command": " ".join(["python -m rapidfire_nb", *argv, "--json"]), "exit": proc.returncode,
           "wall_s": time.time() - t0}
    if proc.returncode != 0 or not dest.exists():
        raise RuntimeError(f"{out['command']} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out["report"] = json.loads(dest.read_text())
    return out


# -- rapidfire bench through its command line, in this process ----------------------------------

def rapidfire_cli(argv: list[str]) -> int:
    """``rapidfire ARGV`` (``python -m rapidfire_nb ARGV``) in this process: one import of torch
    and the libraries, one CUDA context and one cuBLAS warm-up serve every bench the section runs."""
    from rapidfire_nb.cli import main

    return main(list(argv))


def bench_help() -> str:
    """What ``rapidfire bench --help`` prints (the options this checkout's bench has)."""
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            rapidfire_cli(["bench", "--help"])
        except SystemExit:
            pass
    return buf.getvalue()


def bench_item(item: dict, p: dict, work: Path, first: bool) -> dict:
    """One ``rapidfire bench`` variant; its JSON report (also kept in ``p["raw_dir"]``)."""
    missing = [flag for flag in item.get("needs", []) if flag not in bench_help()]
    if missing:
        return {"skipped": True, "reason": f"flag not available: rapidfire bench --help has no "
                                           f"{', '.join(missing)} in this checkout"}
    argv = list(item["argv"]) + ([] if first else ["--no-warmup"])   # one warm-up per process
    dest = Path(p.get("raw_dir") or work) / f"bench-{item['name']}.json"
    code = rapidfire_cli(["bench", *argv, "--output", str(dest)])
    if code != 0 or not dest.exists():
        raise RuntimeError(f"rapidfire bench {' '.join(argv)} exited {code}")
    return {"command": "rapidfire bench " + " ".join(argv), "what": item.get("what", ""),
            "report": json.loads(dest.read_text())}


def section_vs(p: dict, work: Path) -> dict:
    """``rapidfire bench --vs optuna``: time to the winner beside Optuna + TRL."""
    import importlib.util

    if importlib.util.find_spec("optuna") is None:
        return {"skipped": True, "reason": "Optuna is not importable here: tests/gpu/prepare carries its "
                                           "wheel (with alembic, sqlalchemy, greenlet, Mako, colorlog)"}
    dest = Path(p.get("raw_dir") or work) / "vs.json"
    code = rapidfire_cli(["bench", *p["argv"], "--output", str(dest)])
    if code != 0 or not dest.exists():
        raise RuntimeError(f"rapidfire bench {' '.join(p['argv'])} exited {code}")
    report = json.loads(dest.read_text())
    report.pop("per_repeat", None)   # its traces stay in raw/vs.json; the medians are in "stats"
    return {"command": "rapidfire bench " + " ".join(p["argv"]), "report": report}


# -- profile: the engine's chunk and TRL's steps under torch.profiler ----------------------------

# (module, attribute path, label): the engine's work the profile times, each call with its thread;
# a name this checkout lacks is listed as missing, never an error
PROBES = (
    ("rapidfire_nb.engine.executor", "LocalChunkExecutor.train_chunk", "chunk"),
    ("rapidfire_nb.engine.executor", "LocalChunkExecutor._steps", "chunk_steps"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.state_dict", "snapshot"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.boundary_state", "snapshot_refs"),
    ("rapidfire_nb.engine.safeformat", "flat_snapshot", "snapshot_flat"),
    ("rapidfire_nb.engine.executor", "flat_snapshot", "snapshot_flat"),   # its own binding of the name
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.park", "park"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.unpark", "unpark"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.swap_in", "swap_in"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.swap_out", "swap_out"),
    ("rapidfire_nb.engine.adapters.base", "RunTrainer.evaluate", "evaluate"),
    ("rapidfire_nb.engine.persistence", "Persistence.submit_chunk", "checkpoint_handoff"),
    ("rapidfire_nb.engine.store", "ExperimentStore.save_checkpoint", "checkpoint_write"),
    ("transformers", "Trainer._inner_training_loop", "trl_train_loop"),
)
BOUNDARY = ("snapshot", "snapshot_refs", "snapshot_flat", "park", "unpark", "swap_in", "swap_out",
            "checkpoint_handoff", "checkpoint_write")
SYNC_OPS = {"aten::_local_scalar_dense": "item_reads", "aten::nonzero": "nonzero",
            "aten::copy_": "copies", "aten::_to_copy": "to_copies",
            "cudaMemcpyAsync": "memcpy_calls", "cudaMemcpy": "memcpy_calls",
            "cudaLaunchKernel": "launches", "cudaLaunchKernelExC": "launches", "cuLaunchKernel": "launches",
            "cuLaunchKernelEx": "launches", "cudaGraphLaunch": "launches"}


class Probes:
    """Wrappers that time the engine's boundary work (``PROBES``) and a global optimizer hook
    that marks every step's end, with ``perf_counter`` and the thread; each also leaves a
    ``rfcheck::LABEL`` range in the profile, so the ops inside can be counted."""

    def __init__(self):
        self.calls: list[tuple[str, int, float, float]] = []
        self.steps: list[tuple[int, float]] = []
        self.installed: list[str] = []
        self.missing: list[str] = []
        self._undo: list = []

    def __enter__(self):
        import importlib

        import torch

        for module, path, label in PROBES:
            try:
                owner = importlib.import_module(module)
                *outer, name = path.split(".")
                for part in outer:
                    owner = getattr(owner, part)
                getattr(owner, name)
            except (ImportError, AttributeError):
                self.missing.append(f"{module}.{path}")
                continue
            targets = [owner]
            if isinstance(owner, type):   # subclasses that define the method themselves
                stack = list(owner.__subclasses__())
                while stack:
                    sub = stack.pop()
                    stack += sub.__subclasses__()
                    if name in vars(sub):
                        targets.append(sub)
            for target in targets:
                self._patch(target, name, label)
            self.installed.append(f"{module}.{path}")

        def step_end(optimizer, args, kwargs):
            self.steps.append((threading.get_ident(), time.perf_counter()))
            with torch.profiler.record_function("rfcheck::step_end"):
                pass

        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(step_end)
        return self

    def _patch(self, owner, name: str, label: str) -> None:
        import functools

        import torch

        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        fn = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
        calls = self.calls

        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                with torch.profiler.record_function(f"rfcheck::{label}"):
                    return fn(*a, **k)
            finally:
                calls.append((label, threading.get_ident(), t0, time.perf_counter()))

        setattr(owner, name, type(original)(timed) if isinstance(original, (staticmethod, classmethod)) else timed)
        self._undo.append((owner, name, original))

    def __exit__(self, *exc):
        self._hook.remove()
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        return False

    def clear(self) -> None:
        self.calls.clear()
        self.steps.clear()


def _median_ms(xs) -> float | None:
    xs = list(xs)
    return 1000 * statistics.median(xs) if xs else None


def step_times(probes: Probes, chunk_label: str) -> dict:
    """From the probes: each chunk's first step (chunk start to its first optimizer step's end)
    against its steady steps (one step end to the next), in the training thread; and, for the
    engine, the steady steps during which the checkpoint writer was busy against the others."""
    chunks = [(tid, a, b) for label, tid, a, b in probes.calls if label == chunk_label]
    writes = [(a, b) for label, _, a, b in probes.calls if label == "checkpoint_write"]
    first, steady, busy, idle = [], [], [], []
    for tid, a, b in chunks:
        ends = sorted(t for th, t in probes.steps if th == tid and a <= t <= b)
        if not ends:
            continue
        first.append(ends[0] - a)
        for s0, s1 in zip(ends, ends[1:]):
            steady.append(s1 - s0)
            (busy if any(w0 < s1 and w1 > s0 for w0, w1 in writes) else idle).append(s1 - s0)
    out = {"chunks": len(chunks), "steps": len(first) + len(steady),
           "first_step_ms": _median_ms(first), "steady_step_ms": _median_ms(steady),
           "first_steps_ms": [1000 * x for x in first]}
    if out["first_step_ms"] is not None and out["steady_step_ms"]:
        out["first_vs_steady"] = out["first_step_ms"] / out["steady_step_ms"]
    if writes:
        out["steady_step_ms_writer_busy"] = _median_ms(busy)
        out["steady_step_ms_writer_idle"] = _median_ms(idle)
        out["steady_steps_writer_busy"] = len(busy)
    return out


def boundary_times(probes: Probes) -> dict:
    out = {}
    for label in BOUNDARY:
        ms = [1000 * (b - a) for lab, _, a, b in probes.calls if lab == label]
        if ms:
            out[label] = {"calls": len(ms), "median_ms": statistics.median(ms), "total_ms": sum(ms),
                          "max_ms": max(ms)}
    return out


def _is_device(e) -> bool:
    return "CUDA" in str(getattr(e, "device_type", "")) or "cuda" in str(getattr(e, "device_type", ""))


def _memcpy_kind(name: str) -> str | None:
    if "memcpy" not in name.lower() or name.startswith("cuda"):
        return None
    for kind in ("DtoH", "HtoD", "DtoD", "HtoH"):
        if kind in name:
            return kind + (" pageable" if "Pageable" in name else "")
    return "other"


def profile_analysis(events, chunk_label: str, boundary: bool) -> dict:
    """Per step of the training thread (windows between ``rfcheck::step_end`` markers, the first
    from the chunk's start): host syncs and copies, kernel launches, device busy time, memcpys;
    the ops' self time per step by name; and the ops inside each boundary range."""
    import bisect
    import collections

    evs = [e for e in events if not _is_device(e)]
    dev = sorted((e for e in events if _is_device(e)), key=lambda e: e.time_range.start)
    markers = [e for e in evs if e.name == "rfcheck::step_end"]
    if not markers:
        return {"captured": False, "reason": "no step markers in the profile (the training thread's "
                                             "ops were not captured)"}
    tid = collections.Counter(e.thread for e in markers).most_common(1)[0][0]
    own = sorted((e for e in evs if e.thread == tid), key=lambda e: e.time_range.start)
    others = sorted((e for e in evs if e.thread != tid), key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in own]
    ostarts = [e.time_range.start for e in others]
    dstarts = [e.time_range.start for e in dev]
    chunks = [e for e in own if e.name == f"rfcheck::{chunk_label}"]
    ends = sorted(e.time_range.start for e in markers if e.thread == tid)
    windows = []   # (start, end, is_first)
    for c in chunks:
        inside = [t for t in ends if c.time_range.start <= t <= c.time_range.end]
        prev = c.time_range.start
        for i, t in enumerate(inside):
            windows.append((prev, t, i == 0))
            prev = t
    if not windows:
        return {"captured": False, "reason": f"no rfcheck::{chunk_label} range with steps in the profile"}

    def tally(ev_list, ev_starts, a, b, into, names=None):
        for e in ev_list[bisect.bisect_left(ev_starts, a):bisect.bisect_left(ev_starts, b)]:
            if e.name.startswith("rfcheck::"):
                continue
            cat = SYNC_OPS.get(e.name)
            if cat:
                into[cat] += 1
            if "synchronize" in e.name.lower() or e.name in ("Stream Sync", "Event Sync", "Context Sync"):
                into["device_syncs"] += 1
            if e.name.startswith("aten::"):
                into["aten_ops"] += 1
            if names is not None:
                names[e.name][0] += e.self_cpu_time_total
                names[e.name][1] += 1

    def device_tally(a, b, into):
        for e in dev[bisect.bisect_left(dstarts, a):bisect.bisect_left(dstarts, b)]:
            if "sync" in e.name.lower():   # CUDA sync events (enable_cuda_sync_events)
                into["device_sync_events"] += 1
                continue
            into["device_us"] += max(0.0, e.time_range.end - e.time_range.start)
            kind = _memcpy_kind(e.name)
            if kind:
                into[f"memcpy {kind}"] += 1

    per = {"first": collections.Counter(), "steady": collections.Counter()}
    n = {"first": 0, "steady": 0}
    names = collections.defaultdict(lambda: [0.0, 0])
    other_threads = collections.Counter()
    other_names = collections.defaultdict(lambda: [0.0, 0])
    wall = {"first": 0.0, "steady": 0.0}
    for a, b, is_first in windows:
        key = "first" if is_first else "steady"
        n[key] += 1
        wall[key] += b - a
        tally(own, starts, a, b, per[key], names)
        device_tally(a, b, per[key])
        if not is_first:
            tally(others, ostarts, a, b, other_threads, other_names)
    steps = n["first"] + n["steady"]

    def per_step(counter, k):
        return {c: v / k for c, v in sorted(counter.items())} if k else {}

    out = {"captured": True, "thread": tid, "steps": steps, "first_steps": n["first"], "steady_steps": n["steady"],
           "per_step_first": per_step(per["first"], n["first"]),
           "per_step_steady": per_step(per["steady"], n["steady"]),
           "profiled_step_ms": {k: wall[k] / 1000 / n[k] if n[k] else None for k in wall},
           "self_us_per_step": {k: (v[0] / steps, v[1] / steps) for k, v in names.items()},
           "other_threads_per_steady_step": per_step(other_threads, n["steady"]),
           "other_threads_top": sorted(((k, v[0] / max(n["steady"], 1)) for k, v in other_names.items()),
                                       key=lambda kv: -kv[1])[:8]}
    if boundary:
        inside: dict = {}
        for e in own + others:
            label = e.name[len("rfcheck::"):] if e.name.startswith("rfcheck::") else None
            if label not in BOUNDARY:
                continue
            group = own if e.thread == tid else others
            gstarts = starts if e.thread == tid else ostarts
            c = inside.setdefault(label, collections.Counter())
            c["calls"] += 1
            sub = [x for x in group[bisect.bisect_left(gstarts, e.time_range.start):
                                    bisect.bisect_right(gstarts, e.time_range.end)]
                   if x.thread == e.thread and x is not e]
            tally(sub, [x.time_range.start for x in sub], e.time_range.start, e.time_range.end + 1e-3, c)
            device_tally(e.time_range.start, e.time_range.end, c)
        out["boundary_ops"] = {k: dict(v) for k, v in inside.items()}
    return out


def start_profiler(cuda: bool):
    """A started torch.profiler over every thread (the engine trains in its own), with CUDA
    activity and CUDA sync events where this torch has them; falls back step by step to what it
    has. Returns the profiler and whether it follows every thread."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    tries = [(dict(profile_all_threads=True, enable_cuda_sync_events=cuda), True),
             (dict(profile_all_threads=True), True), (None, False)]
    failed = []
    for kw, all_threads in tries:
        prof = None
        try:
            if kw is None:
                prof = profile(activities=acts)
            else:
                from torch.profiler import _ExperimentalConfig

                prof = profile(activities=acts, experimental_config=_ExperimentalConfig(**kw))
            prof.start()
            return prof, all_threads, failed
        except (TypeError, RuntimeError, ImportError) as exc:
            failed.append(f"{kw}: {type(exc).__name__}: {exc}"[:300])
            if prof is not None:   # a start that failed half way must not block the next try
                try:
                    prof.stop()
                except Exception:
                    pass
    raise RuntimeError(f"torch.profiler would not start: {failed}")


def section_profile(p: dict, work: Path) -> dict:
    """The same chunks trained by the engine and by TRL (``rapidfire bench``'s own two sides, eval
    off), each under ``torch.profiler``: per step the host syncs, copies and launches; the first
    step of a chunk against the steady ones; the engine's boundary work (snapshot, park, swap,
    checkpoint hand-off and the writer's write); and the host ops whose time per step differs most."""
    import copy
    import gc
    from dataclasses import replace

    import torch

    from rapidfire_nb.bench.presets import PRESETS, build_base, make_datasets, make_group
    from rapidfire_nb.bench.runners import run_interleaved, run_sequential

    preset = replace(PRESETS[p["preset"]], **p.get("overrides", {}))
    cuda = preset.device.startswith("cuda")
    if cuda and not _cuda():
        return {"skipped": True, "reason": f"preset {preset.name} needs CUDA"}
    pristine, tok = build_base(preset)
    train_ds, _ = make_datasets(preset)
    group = make_group(preset, preset.n_configs)
    specs = group.expand()
    # the untimed warm-up the bench makes: kernels, cuBLAS handles and lazy imports, off the profile
    wp = replace(preset, steps_per_chunk=2, num_chunks=1)
    wtrain, _ = make_datasets(wp, n_train=wp.n_train)
    run_interleaved(wp, make_group(wp, 1), (copy.deepcopy(pristine), tok), wtrain, None, str(work),
                    tracking=None, offload=p.get("offload", "auto"))
    run_sequential(wp, make_group(wp, 1).expand(), pristine, tok, wtrain, None, str(work), False)
    out = {"preset": {k: getattr(preset, k) for k in ("name", "hidden", "layers", "batch", "seq_len", "dtype",
                                                      "device", "n_configs", "num_chunks", "steps_per_chunk")},
           "offload": p.get("offload", "auto"), "eval": "none", "device_activity": cuda}
    sides = {}
    with Probes() as probes:
        out["probes_missing"] = probes.missing
        for side in ("engine", "trl"):
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
            probes.clear()
            prof, all_threads, refused = start_profiler(cuda)
            t0 = time.time()
            try:
                if side == "engine":
                    res = run_interleaved(preset, group, (copy.deepcopy(pristine), tok), train_ds, None, str(work),
                                          tracking=None, offload=p.get("offload", "auto"))
                else:   # in this thread where the profiler cannot follow others
                    res = run_sequential(preset, specs, pristine, tok, train_ds, None, str(work), False,
                                         main_thread=not all_threads)
                if cuda:
                    torch.cuda.synchronize()
            finally:
                prof.stop()
            wall = time.time() - t0
            t1 = time.time()
            label = "chunk_steps" if side == "engine" else "trl_train_loop"
            rec = {"wall_s": wall, "all_threads": all_threads, "profiler_configs_refused": refused,
                   "step_ms_unprofiled_clock": res.get("step_ms"),
                   "steps": step_times(probes, label)}
            if side == "engine":
                rec["boundary_ms"] = boundary_times(probes)
                rec["split_s"] = {k: res.get(k) for k in ("train_s", "swap_s", "setup_s", "snapshot_s",
                                                          "checkpoint_s", "write_wait_s", "writer_busy_s",
                                                          "writer_cpu_s") if k in res}
            if side == "trl" or all_threads:
                rec["ops"] = profile_analysis(prof.events(), label, boundary=side == "engine")
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                if cuda:   # the device's side too: the key is named differently across torch versions
                    for key in ("self_device_time_total", "self_cuda_time_total"):
                        try:
                            table += "\n" + prof.key_averages().table(sort_by=key, row_limit=25)
                            break
                        except Exception:
                            continue
                raw = Path(p.get("raw_dir") or work)
                (raw / f"profile-{side}.txt").write_text(table)
            else:
                rec["ops"] = {"captured": False, "reason": "this torch's profiler cannot follow the engine's "
                                                           "thread (no profile_all_threads)"}
            rec["analysis_s"] = time.time() - t1
            sides[side] = rec
            del prof
    out.update(sides)
    out["compare"] = compare_profiles(sides)
    return out


def compare_profiles(sides: dict) -> dict:
    """Engine against TRL: step times, syncs and copies per step, and the host ops whose self
    time per step differs most."""
    e, t = sides["engine"], sides["trl"]
    out = {}
    es, ts = e["steps"], t["steps"]
    if es.get("steady_step_ms") and ts.get("steady_step_ms"):
        out["steady_step_ratio"] = es["steady_step_ms"] / ts["steady_step_ms"]
    if es.get("first_step_ms") and ts.get("first_step_ms"):
        out["first_step_ratio"] = es["first_step_ms"] / ts["first_step_ms"]
    eo, to = e.get("ops", {}), t.get("ops", {})
    if eo.get("captured") and to.get("captured"):
        keys = sorted(set(eo["per_step_steady"]) | set(to["per_step_steady"]))
        out["per_steady_step"] = {k: [eo["per_step_steady"].get(k, 0.0), to["per_step_steady"].get(k, 0.0)]
                                  for k in keys}
        a, b = eo["self_us_per_step"], to["self_us_per_step"]
        diffs = [(k, a.get(k, (0.0, 0))[0] - b.get(k, (0.0, 0))[0], a.get(k, (0.0, 0))[0], b.get(k, (0.0, 0))[0],
                  a.get(k, (0.0, 0))[1], b.get(k, (0.0, 0))[1]) for k in set(a) | set(b)]
        diffs.sort(key=lambda d: -abs(d[1]))
        out["ops_differing_most"] = [{"op": k, "diff_us_per_step": d, "engine_us": x, "trl_us": y,
                                      "engine_calls": ce, "trl_calls": ct}
                                     for k, d, x, y, ce, ct in diffs[:12]]
    return out


# -- packing probe: 4 LoRA adapters in one batch against 4 steps --------------------------------

def section_packing(p: dict, work: Path) -> dict:
    """One forward and backward of ``runs`` LoRA adapters on one concatenated batch, each row
    routed to its run's adapter and each run's loss its own token mean, against the same adapters
    trained one after another (one active at a time, as the engine trains them). Two routings:
    PEFT's mixed-batch path (``adapter_names=``; PEFT allows it only outside training mode, so the
    model is put in eval mode, which changes nothing here: no dropout anywhere) and contiguous row
    slices per adapter. Each adapter's gradients are checked against the sequential ones."""
    import types

    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear

    cuda = p["device"].startswith("cuda")
    if cuda and not _cuda():
        return {"skipped": True, "reason": "needs CUDA"}
    create = model_factory(p["model"], p["device"])
    model, tok = create({})
    k, b, seq = p["runs"], p["batch"], p["seq_len"]
    names = [f"run{i}" for i in range(k)]
    lora = LoraConfig(r=p["lora_r"], lora_alpha=2 * p["lora_r"], lora_dropout=0.0,
                      target_modules=list(p["lora_targets"]), init_lora_weights=False)
    torch.manual_seed(0)
    pm = get_peft_model(model, lora, adapter_name=names[0])
    for name in names[1:]:
        pm.add_adapter(name, lora)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (k * b, seq), generator=gen).to(p["device"])
    own = {name: [(n, q) for n, q in pm.named_parameters() if "lora_" in n and f".{name}." in n] for name in names}
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def losses(logits, rows):
        lg = logits[:, :-1].float()
        tok_loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.size(-1)), rows[:, 1:].reshape(-1),
                                                     reduction="none").view(rows.size(0), -1)
        return [tok_loss[i * b:(i + 1) * b].mean() for i in range(rows.size(0) // b)]

    def trainable(which):
        for name in names:
            for _, q in own[name]:
                q.requires_grad_(name in which)

    def grads():
        return {name: {n: q.grad.detach().clone() if q.grad is not None else None for n, q in own[name]}
                for name in names}

    def sequential():
        pm.train()
        ms = 0.0
        for i, name in enumerate(names):
            pm.base_model.set_adapter(name)
            trainable({name})
            sync()
            t0 = time.perf_counter()
            x = ids[i * b:(i + 1) * b]
            out = pm(input_ids=x, use_cache=False)
            losses(out.logits, x)[0].backward()
            sync()
            ms += 1000 * (time.perf_counter() - t0)
        return ms

    def packed_peft():
        pm.eval()
        trainable(set(names))
        sync()
        t0 = time.perf_counter()
        with torch.enable_grad():
            out = pm(input_ids=ids, use_cache=False, adapter_names=[n for n in names for _ in range(b)])
            sum(losses(out.logits, ids)).backward()
        sync()
        return 1000 * (time.perf_counter() - t0)

    def sliced_forward(self, x, *args, **kwargs):
        result = self.base_layer(x, *args, **kwargs)
        parts = []
        for i, name in enumerate(names):
            xs = x[i * b:(i + 1) * b]
            a_, b_ = self.lora_A[name], self.lora_B[name]
            parts.append(b_(a_(xs.to(a_.weight.dtype))) * self.scaling[name])
        return result + torch.cat(parts).to(result.dtype)

    def packed_slices():
        layers = [m for m in pm.modules() if isinstance(m, LoraLinear)]
        for m in layers:
            m.forward = types.MethodType(sliced_forward, m)
        try:
            pm.train()
            trainable(set(names))
            sync()
            t0 = time.perf_counter()
            out = pm(input_ids=ids, use_cache=False)
            sum(losses(out.logits, ids)).backward()
            sync()
            return 1000 * (time.perf_counter() - t0)
        finally:
            for m in layers:
                del m.forward

    def run(fn):
        times = []
        for rep in range(p["warmup"] + p["reps"]):
            pm.zero_grad(set_to_none=True)
            ms = fn()
            if rep >= p["warmup"]:
                times.append(ms)
        return statistics.median(times), grads(), times

    dtype = next(iter(own[names[0]]))[1].dtype
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}.get(
        _dtype(p["model"].get("dtype", "float32")), 1e-4)
    seq_ms, ref, seq_times = run(sequential)
    out = {"runs": k, "rows_per_run": b, "seq_len": seq, "model_params": sum(q.numel() for q in model.parameters()),
           "model_dtype": p["model"].get("dtype", "float32"), "adapter_dtype": str(dtype).replace("torch.", ""),
           "lora_r": p["lora_r"], "lora_targets": list(p["lora_targets"]), "device": p["device"],
           "reps": p["reps"], "sequential_ms": seq_ms, "sequential_times_ms": seq_times,
           "grad_rtol": tol, "paths": {}}
    for label, fn in (("peft_mixed_batch", packed_peft), ("row_slices", packed_slices)):
        try:
            ms, got, times = run(fn)
        except Exception as exc:   # a PEFT without the mixed-batch path, for one
            out["paths"][label] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        worst, close = 0.0, True
        for name in names:
            for n, g in got[name].items():
                r = ref[name][n]
                if g is None or r is None:
                    close = False
                    continue
                worst = max(worst, float((g.float() - r.float()).norm() / (r.float().norm() + 1e-30)))
                close = close and torch.allclose(g.float(), r.float(), rtol=tol, atol=tol * float(r.abs().max()))
        out["paths"][label] = {"ms": ms, "times_ms": times, "speedup": seq_ms / ms, "grads_allclose": bool(close),
                               "grads_max_rel_err": worst}
    good = {n: x for n, x in out["paths"].items() if "ms" in x and x["grads_allclose"]}
    if good:   # the figure counts only where the packed gradients are the sequential ones
        best = max(good, key=lambda n: good[n]["speedup"])
        out["best_path"], out["speedup"] = best, good[best]["speedup"]
    timed = [x["speedup"] for x in out["paths"].values() if "ms" in x]
    out["speedup_any_path"] = max(timed) if timed else None
    out["tokens_per_s"] = {"sequential": k * b * seq / (seq_ms / 1000),
                           **{n: k * b * seq / (x["ms"] / 1000) for n, x in out["paths"].items() if "ms" in x}}
    return out


SECTIONS = {"env": section_env, "exactness": section_exactness, "precision": section_precision,
            "offload": section_offload, "memory": section_memory, "ray": section_ray,
            "profile": section_profile, "packing": section_packing, "vs": section_vs}
def selftest_item(item: dict, p: dict, work: Path, first: bool) -> dict:
    """An item that does what it is told (``ok``, ``error``, ``crash``, ``hang``): the test suite's
    check of how ``run`` isolates the items of a section, without any library to load."""
    what = item.get("do", "ok")
    if what == "error":
        raise RuntimeError(f"item {item['name']} failed on purpose")
    if what == "crash":
        os._exit(9)
    if what == "hang":
        time.sleep(10**6)
    return {"name": item["name"], "first_in_process": first, "pid": os.getpid()}


ITEMS = {"bench": bench_item, "selftest": selftest_item}   # sections made of items, each recorded as it ends

TRAINS = {"exactness", "precision", "offload", "memory", "profile", "packing", "vs", "bench"}


def quiet_libraries() -> None:
    """Progress bars and library chatter off: the report is what is read."""
    from rapidfire_nb._quiet import import_peft_quietly

    import_peft_quietly()
    import datasets
    import transformers

    datasets.disable_progress_bar()
    transformers.logging.set_verbosity_error()


def _jsonable(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool, float)):
        return obj
    return str(obj)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(obj), indent=1))
    tmp.replace(path)


def run_items(name: str, params: dict, work: Path) -> int:
    """A section made of items (``ITEMS``): ``ITEMS_DIR/ITEM.start`` before each one and
    ``ITEMS_DIR/ITEM.json`` (its result or error) after it, so ``run`` records each as it ends,
    stops one that runs past its own time limit and starts a fresh process for the rest."""
    items_dir = Path(params["items_dir"])
    first = True
    for item in params["items"]:
        (items_dir / f"{item['name']}.start").write_text(str(time.time()))
        t0 = time.time()
        try:
            if params.get("inject") == "error" or item.get("inject") == "error":
                raise RuntimeError(f"failure injected into {name}/{item['name']} (a self-test of isolation)")
            if item.get("inject") == "hang":
                time.sleep(10**6)
            result = ITEMS[name](item, params, work, first)
            res = {"ok": True, "result": result}
            first = bool(isinstance(result, dict) and result.get("skipped")) and first
        except BaseException as exc:
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        res["seconds"] = time.time() - t0
        _write_json(items_dir / f"{item['name']}.json", res)
        import gc

        gc.collect()
        cuda = "torch" in sys.modules and _cuda()
        if cuda:
            import torch

            torch.cuda.empty_cache()
        if not res["ok"] and (cuda or params.get("fresh_after_error")):
            return 3   # a CUDA error can leave this process's context unusable: a fresh one goes on
    return 0


def main(argv: list[str]) -> int:
    name, params, dest = argv[0], json.loads(argv[1]), Path(argv[2])
    if name in ITEMS:
        work = Path(tempfile.mkdtemp(prefix=f"rf-gpu-{name}-", dir=params.pop("workdir", None)))
        try:
            if name != "selftest":
                quiet_libraries()
            return run_items(name, params, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    inject = params.pop("inject", None)
    work = Path(tempfile.mkdtemp(prefix=f"rf-gpu-{name}-", dir=params.pop("workdir", None)))
    t0 = time.time()
    try:
        if inject == "error":
            raise RuntimeError(f"failure injected into section {name!r} (a self-test of isolation)")
        if inject == "hang":
            time.sleep(10**6)
        if name in TRAINS:
            quiet_libraries()
        result = {"ok": True, "result": SECTIONS[name](params, work)}
    except BaseException as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = time.time() - t0
    _write_json(dest, result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
