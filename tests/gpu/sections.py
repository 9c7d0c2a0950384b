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

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
          create_model=None) -> dict:
    """One experiment through the Experiment API; its runs' weights, losses, scaler states and the
    engine's timeline."""
    from rapidfire_nb import Experiment

    create_model = create_model or model_factory(p["model"], p["device"])
    train_ds, eval_ds = datasets_for(p)
    exp = Experiment(name, experiment_path=workdir, tracking=[], offload=offload)
    try:
        t0 = time.time()
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
    ``CUBLAS_WORKSPACE_CONFIG`` for this process, as torch asks)."""
    import torch

    out = {"device": p["device"], "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    for mode in ("default", "deterministic"):
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
    never = train(p, lrs, p["precision"], work, "offload-never", offload="never", create_model=create_model)
    originals = RunTrainer.park, RunTrainer.unpark
    RunTrainer.park, RunTrainer.unpark = observed("park", originals[0]), observed("unpark", originals[1])
    try:
        always = train(p, lrs, p["precision"], work, "offload-always", offload="always", create_model=create_model)
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


SECTIONS = {"env": section_env, "exactness": section_exactness, "precision": section_precision,
            "offload": section_offload, "memory": section_memory, "ray": section_ray}


TRAINS = {"exactness", "precision", "offload", "memory"}


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


def main(argv: list[str]) -> int:
    name, params, dest = argv[0], json.loads(argv[1]), Path(argv[2])
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
    dest.write_text(json.dumps(_jsonable(result), indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
