"""The worker's side of a gang: its process group and the sharded copy of a base (FSDP2).

A gang is k Ray workers that train the chunks of sharded runs together, in lockstep (the
controller sends the same call to every member; workers/executor.py). Each member joins one
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

The sockets a gang opens: rank 0 serves the rendezvous (a ``TCPStore``, no authentication) on
the address it was given and nowhere else (torch's own ``init_method="tcp://..."`` listens on
every interface), and each member's transport (gloo's pairs, NCCL's bootstrap) listens on the
one local interface that holds the address it reaches rank 0 from: loopback on a local cluster,
the node's address on a real one. A member closes them when it leaves the gang (``close``) or
when its process ends.
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


def local_address_towards(addr: str) -> str:
    """The address of this machine that reaches ``addr`` (rank 0's): loopback for loopback, else
    the source address the routing table picks (a UDP connect sends nothing)."""
    import ipaddress
    import socket

    info = socket.getaddrinfo(addr, None, type=socket.SOCK_DGRAM)[0]
    family, ip = info[0], info[4][0]
    if ipaddress.ip_address(ip.split("%")[0]).is_loopback:
        return ip
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        return s.getsockname()[0]


def interface_of(ip: str) -> str | None:
    """The name of the network interface that holds ``ip`` (``lo`` for 127.0.0.1), or None."""
    import psutil

    bare = ip.split("%")[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == bare for a in addrs):
            return name
    return None


def rendezvous_store(addr: str, port: int, rank: int, size: int, timeout: datetime.timedelta):
    """The gang's ``TCPStore``: rank 0 serves it on ``addr``:``port`` alone, the others connect.

    torch's server binds the wildcard address whatever host it is given; a socket bound here to
    ``addr`` and handed over (``master_listen_fd``, which the store then owns and closes) keeps it
    to that one address."""
    import socket

    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(addr, port, size, False, timeout)
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((addr, port), family=family, backlog=128)
    # the store owns the descriptor from here on (it closes it with its server)
    return dist.TCPStore(addr, port, size, True, timeout, master_listen_fd=sock.detach())


_TRANSPORT_ENV = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


def pin_transport(backend: str, local_ip: str) -> None:
    """Keep the backend's own listening sockets on ``local_ip``'s interface: gloo's pairs bind the
    address the machine's host name resolves to, NCCL's bootstrap the first interface it likes,
    either of which may be public on a machine whose gang is all on loopback. A name the user set
    is kept. Set for the process's life: a member is in one gang for life, and NCCL reads it when
    its first collective runs, not at the rendezvous."""
    var = _TRANSPORT_ENV[backend]
    if not os.environ.get(var):
        name = interface_of(local_ip)
        if name is not None:
            os.environ[var] = name


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
        timeout = datetime.timedelta(seconds=timeout_s)
        pin_transport(backend, local_address_towards(addr))
        self._store = rendezvous_store(addr, port, rank, size, timeout)
        dist.init_process_group(backend, store=self._store, rank=rank, world_size=size,
                                timeout=timeout)
        self.name, self.rank, self.size, self.backend = name, rank, size, backend
        self.device_type = "cuda" if cuda else "cpu"
        self.mesh = init_device_mesh(self.device_type, (size,))

    def close(self) -> None:
        """Leave the gang: its process group and, on rank 0, the rendezvous' listening socket."""
        import torch.distributed as dist

        self.mesh = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None   # the last reference: the store's server closes its socket


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
