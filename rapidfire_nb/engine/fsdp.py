"""The worker's side of a gang: its process group and the sharded copy of a base (FSDP2).

A gang is k Ray workers that train the chunks of sharded runs together, in lockstep (the
controller sends the same call to every member; workers/engine.py). Each member joins one
``torch.distributed`` process group for its life (gloo on CPUs, NCCL on GPUs, with a timeout so
that a collective whose peer died fails instead of waiting forever) and holds, besides the plain
bases its single-device runs train on, a separate copy of each base sharded with PyTorch's FSDP2
(``fully_shard``) over the gang. That copy stays across chunks and runs: a swap between two
sharded runs of one base moves their adapters only.

transformers' and accelerate's FSDP path is not used: on CPU accelerate turns the FSDP plugin
into plain DDP without a word (nothing would be sharded). The run's trainer is built as a
single-process trainer (``fsdp`` off in its args; adapters/sharded.py) and its base is sharded
here; LoRA adapters are kept out of FSDP (``ignored_params``: added after sharding or not, they
stay replicated, their gradients summed by the trainer explicitly).
"""

from __future__ import annotations

import datetime
import os
import warnings

from rapidfire_nb.engine.sharding import fsdp2_settings

# how long a collective may wait for a peer (a dead member's peers fail after this)
GANG_TIMEOUT_S = float(os.environ.get("RAPIDFIRE_GANG_TIMEOUT_S", "120"))


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class GangMembership:
    """This process's place in a gang: rank, size, and the device mesh FSDP2 shards over."""

    def __init__(self, name: str, rank: int, size: int, addr: str, port: int,
                 timeout_s: float = GANG_TIMEOUT_S):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if dist.is_initialized():
            raise RuntimeError("this worker is in a gang already (a process joins one gang for life)")
        cuda = torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
        self.name, self.rank, self.size, self.backend = name, rank, size, backend
        self.device_type = "cuda" if cuda else "cpu"
        self.mesh = init_device_mesh(self.device_type, (size,))


_WARNED: set = set()


def warn_no_effect(training_args: dict) -> None:
    """Once per knob: fsdp_config settings that FSDP2 has no counterpart for here."""
    _, ignored = fsdp2_settings(training_args)
    new = [k for k in ignored if k not in _WARNED]
    if new:
        _WARNED.update(new)
        from rapidfire_nb.errors import RapidFireConfigWarning

        warnings.warn(RapidFireConfigWarning(
            f"fsdp_config: {', '.join(new)} ha{'ve' if len(new) > 1 else 's'} no effect here (runs "
            "are sharded with PyTorch's FSDP2, fully_shard)"), stacklevel=2)


def shard_base(peft_model, membership: GangMembership, training_args: dict) -> None:
    """Shard ``peft_model``'s base over the gang, in place: each wrapped layer (auto_wrap: the
    ``transformer_layer_cls_to_wrap`` classes, else the model's ``_no_split_modules``) is one FSDP
    unit, the rest one root unit. Every LoRA parameter is left out (replicated)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    settings, _ = fsdp2_settings(training_args)
    inner = peft_model.get_base_model() if hasattr(peft_model, "get_base_model") else peft_model
    if settings["activation_checkpointing"] and hasattr(inner, "gradient_checkpointing_enable"):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(inner, "enable_input_require_grads"):
            inner.enable_input_require_grads()
    ignored = {p for n, p in peft_model.named_parameters() if "lora_" in n}
    kwargs = dict(mesh=membership.mesh, reshard_after_forward=settings["reshard_after_forward"])
    if settings["offload"] and torch.cuda.is_available():
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if settings["auto_wrap"]:
        wrap = set(settings["wrap"] or getattr(inner, "_no_split_modules", None) or [])
        for module in list(inner.modules()):
            if module is not inner and type(module).__name__ in wrap:
                fully_shard(module, ignored_params=ignored & set(module.parameters()), **kwargs)
    fully_shard(inner, ignored_params=ignored, **kwargs)


class ShardedFactoryMixin:
    """A trainer factory whose bases are sharded over the gang: put before a ``TrainerFactory``
    in the bases of a class (the worker's own factory for its gang runs)."""

    membership: GangMembership | None = None

    def trainer_class_for(self, spec):
        from rapidfire_nb.engine.adapters import trainer_class
        from rapidfire_nb.engine.adapters.sharded import sharded_class

        m = self.membership
        return sharded_class(trainer_class(spec.trainer_type), m.rank, m.size)

    def build(self, rec):
        if self.membership is None:
            raise RuntimeError("a sharded run reached a worker that is in no gang")
        warn_no_effect(rec.spec.training_args)
        m = self.membership
        rt = super().build(rec)
        base = self.bases[rec.spec.base_key()]
        if not getattr(base, "sharded", False) and base.peft_model is not None:
            shard_base(base.peft_model, m, rec.spec.training_args)
            base.sharded = True
        return rt
