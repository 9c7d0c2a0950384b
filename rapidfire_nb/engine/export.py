"""Export a run's weights in the format its consumers load, checked against the model.

A LoRA run's weights live under the adapter name ``run_<id>`` inside the engine's shared
PeftModel. Renaming keys by hand misses PEFT's own conventions (``modules_to_save`` copies are
saved under the wrapped module's name, DoRA magnitudes without ``.weight``), and wrote files whose
tensors did not fit the model. So the export builds the run's model as PEFT would, as a skeleton
on the ``meta`` device (no memory, no copy of the base), puts the run's tensors into it (which
checks every shape), refuses weights that are missing or left over, and lets PEFT's
``get_peft_model_state_dict`` name what is saved.

A warm start copies one run's adapter into another's the same way: the parent's weights in PEFT's
saved form (``adapter_state_dict``, or ``get_peft_model_state_dict`` of its live adapter), loaded
under the clone's adapter name by ``set_peft_model_state_dict`` (``load_adapter_state``), instead
of renaming keys by hand.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from rapidfire_nb.errors import RapidFireError


class ExportError(RapidFireError):
    """A run's weights do not fit the model they are exported for."""


def _meta_skeleton(model):
    """An empty copy of ``model``'s architecture on the meta device."""
    import torch

    config = getattr(model, "config", None)
    from_config = getattr(type(model), "_from_config", None)
    if config is not None and from_config is not None:
        try:
            with torch.device("meta"):
                return from_config(copy.deepcopy(config))
        except Exception:
            pass
    return copy.deepcopy(model).to("meta")   # a custom module: copy it once, then drop the data


def adapter_state_dict(base_model, lora_config, weights: dict, adapter: str) -> dict:
    """``weights`` of adapter ``adapter`` (named as in the engine's shared PeftModel, e.g.
    ``...lora_A.run_3.weight``) in PEFT's saved form, as ``get_peft_model_state_dict`` names it:
    what ``adapter_model.safetensors`` holds and ``set_peft_model_state_dict`` loads under any
    adapter name. Raises ``ExportError`` when they do not fit a fresh model with ``lora_config``."""
    return _saved_form(_meta_skeleton(base_model), lora_config, weights, adapter)


def _saved_form(base_skeleton, lora_config, weights: dict, adapter: str) -> dict:
    from peft import get_peft_model, get_peft_model_state_dict

    skeleton_config = copy.deepcopy(lora_config)
    skeleton_config.base_model_name_or_path = None   # the skeleton's name; the file keeps the real one
    import torch

    # the adapter's tensors made on the meta device too: made on the CPU and moved, they would
    # be initialised from the process's random stream, which the runs training beside a final
    # checkpoint's write draw from (their results must not depend on it)
    with torch.device("meta"):
        skeleton = get_peft_model(base_skeleton, skeleton_config, adapter_name=adapter, low_cpu_mem_usage=True)
    # PEFT marks exactly the adapter's own tensors trainable (LoRA factors, DoRA magnitudes,
    # modules_to_save copies)
    _fill_skeleton(skeleton, weights, adapter)
    state = get_peft_model_state_dict(skeleton, adapter_name=adapter, save_embedding_layers=False)
    meta = [k for k, v in state.items() if v.device.type == "meta"]
    if meta:
        raise ExportError(f"the export of {adapter} lacks the tensors {meta[:3]}")
    return state


def _fill_skeleton(skeleton, weights: dict, adapter: str) -> None:
    """Put ``weights`` into the adapter tensors of a PEFT skeleton (exactly those PEFT marks
    trainable: LoRA factors, DoRA magnitudes, modules_to_save copies), or ``ExportError``."""
    wanted = {name for name, p in skeleton.named_parameters() if p.requires_grad}
    unexpected, missing = sorted(set(weights) - wanted), sorted(wanted - set(weights))
    if unexpected or missing:
        raise ExportError(
            f"the weights of {adapter} do not fit a fresh model with its LoRA config: "
            + (f"{len(missing)} missing (e.g. {missing[:2]}) " if missing else "")
            + (f"{len(unexpected)} left over (e.g. {unexpected[:2]})" if unexpected else ""))
    try:
        skeleton.load_state_dict(weights, strict=False, assign=True)   # raises on a shape mismatch
    except RuntimeError as exc:
        raise ExportError(f"the weights of {adapter} do not fit the model: {exc}") from None


def load_adapter_state(peft_model, adapter: str, state: dict) -> None:
    """Copy ``state`` (PEFT's saved form: ``adapter_state_dict``, or ``get_peft_model_state_dict``
    of another adapter of the same config) into adapter ``adapter`` of ``peft_model`` through
    ``set_peft_model_state_dict``: a warm start into another run's adapter, values exact. Checked
    first against the adapter's own saved form; on a misfit nothing is changed."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    own = get_peft_model_state_dict(peft_model, adapter_name=adapter, save_embedding_layers=False)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise ExportError(
            f"these weights do not fit adapter {adapter}: "
            + (f"{len(missing)} missing (e.g. {missing[:2]}) " if missing else "")
            + (f"{len(unexpected)} left over (e.g. {unexpected[:2]}) " if unexpected else "")
            + (f"{len(wrong)} of another shape (e.g. {wrong[0]}: {tuple(state[wrong[0]].shape)}, "
               f"needs {tuple(own[wrong[0]].shape)})" if wrong else ""))
    # a copy: peft 0.18 renames the keys of the dict it is given in place
    set_peft_model_state_dict(peft_model, dict(state), adapter_name=adapter)


def export_adapter(base_model, lora_config, weights: dict, adapter: str, path: Path) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` that
    ``PeftModel.from_pretrained`` loads onto ``base_model``'s architecture."""
    from safetensors.torch import save_file

    state = adapter_state_dict(base_model, lora_config, weights, adapter)
    lora_config.save_pretrained(str(path))
    save_file({k: v.detach().contiguous() for k, v in state.items()},
              str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


# what an experiment folder holds besides exports (engine/store.py, tracking/, tuning/)
_FOLDER_OWN = frozenset({"checkpoints", "events.jsonl", "experiment.json", "runs.json", "automl.json",
                         "optuna", "logs", "outputs", "engine.log", "worker.log", "tensorboard", "runs",
                         "mlflow", "trackio", "tracking"})


def check_export_path(path, experiment_folder: Path, overwrite: bool = False) -> Path:
    """Where ``Experiment.export`` may write, or ``ExportError`` saying why not (nothing is
    written): never silently over another export, a file, the current directory by accident
    (``""``) or the experiment folder itself (its checkpoints and log)."""
    import os

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ExportError(f"export path must be a directory name, got {path!r}")
    if "\x00" in os.fspath(path):
        raise ExportError(f"export path {os.fspath(path)!r} holds a NUL byte, which no file name "
                          "may hold; nothing was written")
    if not isinstance(overwrite, bool):
        raise ExportError(f"overwrite must be True or False, got {overwrite!r}")
    target = Path(path).expanduser().absolute()
    resolved = target.resolve()
    folder = Path(experiment_folder).resolve()
    if resolved == folder:
        raise ExportError(f"export path {target} is the experiment folder itself; export into a "
                          "directory of its own (the folder holds the checkpoints and the event log)")
    if folder in resolved.parents:
        # a directory of its own inside the folder (the tutorials' exp.path / "best-adapter") is
        # fine; the engine's and the trackers' own entries are not
        first = resolved.relative_to(folder).parts[0]
        if first in _FOLDER_OWN or first.startswith((".", "events.jsonl")):
            raise ExportError(f"export path {target} is inside {folder / first}, which the "
                              "experiment itself writes; export into a new directory of the "
                              f"folder (say {folder / 'export'}) or somewhere else")
    if resolved in folder.parents:
        raise ExportError(f"export path {target} contains the experiment folder {folder}; export "
                          "into a directory of its own")
    # the nearest folder that exists must take a new entry: a read-only place fails here, with
    # its name, not as a bare OSError halfway through the export
    existing = target
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing if existing.is_dir() else existing.parent, os.W_OK):
        raise ExportError(f"cannot export to {target}: {existing} is not writable here (read-only "
                          "or another user's); choose a folder you can write to. Nothing was written")
    if target.exists() and not target.is_dir():
        raise ExportError(f"export path {target} exists and is not a directory; choose a new name")
    if target.is_dir() and any(target.iterdir()) and overwrite \
            and not any((target / name).is_file() for name in ("adapter_config.json", "config.json")):
        # overwrite=True replaces an earlier export, not a directory of other files (the home
        # folder, a project's root) where an export's file names could replace the user's own
        raise ExportError(f"export path {target} holds files but no earlier export (no "
                          "adapter_config.json or config.json); overwrite=True only writes over an "
                          "export: choose a new directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ExportError(f"export path {target} is not empty ({len(list(target.iterdir()))} "
                          "entries: another export?); choose a new directory, or pass "
                          "overwrite=True to write over its files")
    return target


def export_run(engine, spec, run_id: int, weights: dict, lora_config, path: Path) -> Path:
    """A run's ``weights`` into ``path`` (checked by the caller): a PEFT adapter when
    ``lora_config`` is given (the run's ``peft.LoraConfig``), else the full model; plus the
    tokenizer.

    The files are written into a new folder beside ``path`` and that folder is renamed into
    place: ``save_pretrained`` opens its files by name and would write through a link planted in
    an earlier export (to a file outside it); here nothing that was in ``path`` is ever opened,
    and an earlier export is moved aside and removed (its links removed, never followed)."""
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name[:40]}.export-"))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)    # mkdtemp's 0700 would make the export private
    try:
        _write_export(engine, spec, run_id, weights, lora_config, staging)
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()
        if os.path.lexists(path):
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name[:40]}.old-"))
            os.rename(path, old / "export")    # a link is moved as a link
            os.rename(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _write_export(engine, spec, run_id: int, weights: dict, lora_config, path: Path) -> None:
    import warnings

    model, tokenizer = engine.model_and_tokenizer(spec)
    if lora_config is not None:
        lora_config.base_model_name_or_path = spec.model_name
        with warnings.catch_warnings():
            # transformers 5 deprecates a name PEFT still calls while it saves; the user can do
            # nothing about it, and it was the one line an export printed
            warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            export_adapter(model, lora_config, weights, f"run_{run_id}", path)
    else:
        model = copy.deepcopy(engine.untouched_model(spec))
        try:
            result = model.load_state_dict(weights, strict=False)   # raises on a shape mismatch
        except RuntimeError as exc:
            raise ExportError(f"the weights of run {run_id} do not fit its model: {exc}") from None
        if result.unexpected_keys:
            raise ExportError(f"the weights of run {run_id} hold tensors its model lacks: "
                              f"{result.unexpected_keys[:3]}")
        model.save_pretrained(str(path))
        del model
    tokenizer.save_pretrained(str(path))


# -- RapidFire's final checkpoint, written when a run completes ------------------------------

_BASES: dict = {}   # base key -> (weak reference to the loaded base model, its tokenizer)


def remember_base(spec, model, tokenizer) -> None:
    """Note the base model a run of ``spec`` trains on (run_fit calls this before training):
    ``write_final_checkpoint`` builds the adapter's files from its architecture, on the
    checkpoint writer's thread, which has no engine to ask. Weak: an ended experiment's base is
    not kept alive by this."""
    import weakref

    # another load under the same key may be another architecture or tokenizer: made anew
    key = spec.base_key()
    known = _BASES.get(key)
    if known is None or known[0]() is not model or known[1] is not tokenizer:
        _TOKENIZER_FILES.pop(key, None)
        for cached in [k for k in _SKELETONS if k[0] == key]:
            del _SKELETONS[cached]
    try:
        _BASES[spec.base_key()] = (weakref.ref(model), tokenizer)
    except TypeError:   # a model that takes no weak reference: no final checkpoint before end()
        _BASES.pop(spec.base_key(), None)


def _base_skeleton(model):
    """``model``'s architecture on the meta device, from its class and config: no copy of the
    live (shared, in-training) model is read, and no value is initialised, so no random number
    is drawn. The config's dtype is dropped: building under it would set the process's default
    dtype while other runs train."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    from_config = getattr(type(base), "_from_config", None)
    config = getattr(base, "config", None)
    if from_config is None or config is None:
        return None
    config = copy.deepcopy(config)
    # transformers 5 reads ``dtype``, 4 ``torch_dtype`` (5 keeps it as a deprecated alias)
    attr = "dtype" if "dtype" in config.to_dict() or not hasattr(config, "torch_dtype") else "torch_dtype"
    setattr(config, attr, None)
    with torch.device("meta"):
        return from_config(config)


# Each completion's final checkpoint is written on the checkpoint writer's thread while it holds
# the lock the training steps take, so what can be made once is: the PEFT skeleton of a (base,
# LoRA config) pair, on the meta device under a fixed adapter name (the saved form drops the
# name), and the base tokenizer's files. Building them took ~250 ms a completion on a 22-layer
# model, during which no run could train.
_SKELETONS: dict = {}
_TOKENIZER_FILES: dict = {}
_FIXED_ADAPTER = "final"


def _final_saved_form(base_key, model, lora, weights: dict, adapter: str) -> dict | None:
    import json

    from peft import get_peft_model, get_peft_model_state_dict
    import torch

    key = (base_key, json.dumps(lora.to_dict(), sort_keys=True, default=str))
    skeleton = _SKELETONS.get(key)
    if skeleton is None:
        from rapidfire_nb.engine.hfstate import HF_STATE_LOCK

        # building touches process-wide state of transformers (its init flags): between two
        # training steps. Filling and reading the skeleton after that touch only the skeleton.
        with HF_STATE_LOCK:
            base = _base_skeleton(model)
            if base is None:
                return None
            config = copy.deepcopy(lora)
            config.base_model_name_or_path = None
            # meta tensors: made on the CPU they would draw from the random stream the runs use
            with torch.device("meta"):
                skeleton = get_peft_model(base, config, adapter_name=_FIXED_ADAPTER, low_cpu_mem_usage=True)
        _SKELETONS[key] = skeleton
    renamed = {".".join(_FIXED_ADAPTER if part == adapter else part for part in name.split(".")): t
               for name, t in weights.items()}
    _fill_skeleton(skeleton, renamed, adapter)
    try:
        state = get_peft_model_state_dict(skeleton, adapter_name=_FIXED_ADAPTER, save_embedding_layers=False)
    finally:
        # the cached skeleton keeps no run's weights alive between completions
        skeleton.load_state_dict({k: torch.empty_like(v, device="meta") for k, v in renamed.items()},
                                 strict=False, assign=True)
    meta = [k for k, v in state.items() if v.device.type == "meta"]
    if meta:
        raise ExportError(f"the export of {adapter} lacks the tensors {meta[:3]}")
    return dict(state)


def _tokenizer_files(base_key, tokenizer) -> dict[str, bytes]:
    """The base tokenizer's saved files (name -> bytes), saved once per base."""
    import tempfile

    if tokenizer is None:
        return {}
    files = _TOKENIZER_FILES.get(base_key)
    if files is None:
        from rapidfire_nb.engine.hfstate import HF_STATE_LOCK

        # the tokenizer the runs generate with: saved between two of their steps
        with HF_STATE_LOCK, tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
        _TOKENIZER_FILES[base_key] = files
    return files


def write_final_checkpoint(store, rec) -> Path | None:
    """RapidFire's ``runs/<id>/checkpoints/final_checkpoint/`` of a run that just completed: its
    adapter (``adapter_config.json``, ``adapter_model.safetensors``) and tokenizer, written from
    its checkpoint on disk (``store.load_checkpoint``) on the checkpoint writer's thread, after
    that checkpoint is durable and before the run is logged as completed: when a notebook sees
    the run completed, the adapter is there. The folder is made aside and renamed into place,
    so it appears whole; a run that completes again (resumed, or retrained after a crash)
    replaces it the same way, keeping the ``trainer_state.json`` beside it until that is
    rewritten for the new completion. Full fine-tuning is left to ``end()`` and ``export`` (a
    full model can be many GB). Never raises: a convenience copy must not fail a run."""
    import shutil
    import tempfile
    import warnings


    spec = rec.spec
    if spec.peft_config is None:
        return None
    known = _BASES.get(spec.base_key())
    model = known[0]() if known is not None else None
    if model is None:
        return None   # a base this process did not load (a Ray worker's): end() writes it
    # RapidFire's layout (rapidfire_nb/layout.py names it for the facade)
    path = Path(store.root) / "runs" / str(int(rec.run_id)) / "checkpoints" / "final_checkpoint"
    staging = None
    try:
        ckpt = store.load_checkpoint(rec.run_id)
        if not ckpt:
            return None
        weights = ckpt["trainer"]["weights"]
        lora = _lora_config(spec)
        lora.base_model_name_or_path = spec.model_name
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=".final_checkpoint.writing-"))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        # transformers 5 deprecates a name PEFT still calls while it wraps the skeleton: on the
        # writer's thread that warning goes to the experiment's log, never to a cell, and no
        # process-wide filter is installed for it (catch_warnings would swap the filters of every
        # thread)
        state = _final_saved_form(spec.base_key(), model, lora, weights, f"run_{rec.run_id}")
        if state is None:
            shutil.rmtree(staging, ignore_errors=True)
            return None
        tokenizer_files = _tokenizer_files(spec.base_key(), known[1])
        from safetensors.torch import save_file

        from rapidfire_nb.engine.fsio import atomic_write_bytes

        for name, data in tokenizer_files.items():
            atomic_write_bytes(staging / name, data)
        lora.save_pretrained(str(staging))
        save_file({k: v.detach().contiguous() for k, v in state.items()},
                  str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        old_state = _previous_trainer_state(path / "trainer_state.json")
        if old_state is not None:
            atomic_write_bytes(staging / "trainer_state.json", old_state)
        _replace_dir(staging, path)
        staging = None
        return path
    except Exception as exc:  # noqa: BLE001 - a convenience copy never fails a run
        warnings.warn(f"final checkpoint of run {rec.run_id} not written to {path} when it completed "
                      f"({type(exc).__name__}: {exc}); end() writes it", stacklevel=2)
        return None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _previous_trainer_state(path: Path) -> bytes | None:
    """The bytes of the ``trainer_state.json`` a run's earlier completion left, to keep beside the
    new adapter until it is rewritten; None for anything else found there. Read as a metadata
    file (a regular file, never through a link, at most ``MAX_JSON_BYTES``): a file planted in
    a shared folder may be a pipe, or sparse and of terabytes, which a plain copy would wait on
    or write out whole, filling the disk the runs' checkpoints need."""
    from rapidfire_nb.engine.fsio import MAX_JSON_BYTES, read_regular

    try:
        return read_regular(path, MAX_JSON_BYTES, "metadata file")
    except OSError:
        return None


def _lora_config(spec):
    """The run's ``peft.LoraConfig`` as the run was built with it (its knobs were checked when
    the run was made), ``task_type`` filled in for a causal LM as the run's own config has it."""
    from peft import LoraConfig

    kwargs = dict(spec.peft_config)
    if "task_type" not in kwargs and spec.model_type == "causal_lm":
        kwargs["task_type"] = "CAUSAL_LM"
    return LoraConfig(**kwargs)


def _replace_dir(staging: Path, path: Path) -> None:
    """Rename ``staging`` to ``path``; what was at ``path`` is moved aside first (a link as a
    link, never followed) and removed after."""
    import shutil
    import tempfile

    if not os.path.lexists(path):
        os.rename(staging, path)
        return
    old = Path(tempfile.mkdtemp(dir=path.parent, prefix=".final_checkpoint.old-"))
    os.rename(path, old / "previous")
    os.rename(staging, path)
    shutil.rmtree(old, ignore_errors=True)
