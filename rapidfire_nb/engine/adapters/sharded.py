"""One rank of a run sharded over a gang (engine/fsdp.py): the trainer-side differences.

Every rank of the gang holds the same ``RunTrainer`` (same adapter init, optimizer, schedule,
data stream); they differ only in which rows of each global micro-batch they collate:

- the chunk plan steps on ``devices x per_device_train_batch_size`` rows (``plan_for(devices=)``);
  rank r collates its contiguous slice of each global micro-batch;
- the loss normaliser is the global batch's (``global_items``: the ranks' token counts summed), as
  transformers does across devices, so rank r's loss is its rows' share of the global loss;
- after the backward passes the trainable weights' gradients are summed over the gang
  (``reduce_gradients``): LoRA adapters are kept out of FSDP (``ignored_params``), replicated on
  every rank, so this sum is the one place their gradients meet. Losses that are a mean over the
  rank's own rows (DPO) are weighted by the rank's share of the rows before the sum. The logged
  loss is the gang's, not rank 0's;
- evaluation runs the whole eval set on every rank (the sharded forward needs every rank), so
  every rank reports the same eval metrics;
- each rank keeps its own RNG; the checkpoint holds one per rank (``rng_ranks``).

Private contacts: none beyond base.py's (``Trainer.model_accepts_loss_kwargs`` and
``compute_loss_func`` are read to know whether TRL normalised the loss by the token count).
"""

from __future__ import annotations

import torch

_CLASSES: dict = {}


def sharded_class(cls, rank: int, size: int):
    """``cls`` (a RunTrainer type) as rank ``rank`` of ``size`` (one class per triple)."""
    key = (cls, rank, size)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"Sharded{cls.__name__}", (ShardedSteps, cls),
                             {"rank": rank, "size": size})
    return _CLASSES[key]


class ShardedSteps:
    rank: int = 0
    size: int = 1
    # transformers' own FSDP is off: the gang shards the base itself (FSDP2, engine/fsdp.py)
    ENGINE_ARGS = dict(report_to="none", save_strategy="no", eval_strategy="no",
                       logging_strategy="no", disable_tqdm=True, push_to_hub=False,
                       fsdp="", fsdp_config=None)

    def rank_rows(self, indices: list[int]) -> list[int]:
        n = len(indices)
        if n < self.size:
            raise ValueError(f"a micro-batch of {n} rows cannot be split over {self.size} devices")
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return indices[start:start + base + (1 if self.rank < extra else 0)]

    def collate(self, indices: list[int]):
        self._rows_mine = getattr(self, "_rows_mine", 0) + len(self.rank_rows(indices))
        self._rows_all = getattr(self, "_rows_all", 0) + len(indices)
        return super().collate(self.rank_rows(indices))

    def global_items(self, n_items):
        import torch.distributed as dist

        t = self.trainer
        self._token_normalised = n_items is not None and (
            bool(getattr(t, "model_accepts_loss_kwargs", False)) or t.compute_loss_func is not None)
        if not self._token_normalised:
            return n_items
        total = torch.as_tensor(n_items, dtype=torch.float64).reshape(1).clone()
        dist.all_reduce(total)
        out = torch.as_tensor(total.item(), dtype=getattr(n_items, "dtype", torch.int64))
        return out.to(getattr(n_items, "device", "cpu"))

    def reduce_gradients(self, loss: float, n_items) -> float:
        import torch.distributed as dist

        share = 1.0
        if not self._token_normalised:   # a mean over this rank's rows: weight by its share
            share = self._rows_mine / max(1, self._rows_all)
        self._rows_mine = self._rows_all = 0
        params = [p for _, p in self.trainable_named_parameters() if p.grad is not None]
        if params:
            flat = torch.cat([p.grad.detach().reshape(-1).to(torch.float32) for p in params])
            if share != 1.0:
                flat.mul_(share)
            flat = torch.cat([flat, torch.tensor([loss * share], dtype=torch.float32)])
            dist.all_reduce(flat)
            offset = 0
            for p in params:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
            return float(flat[-1])
        total = torch.tensor([loss * share], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total)

    # -- checkpoint: one RNG state per rank ------------------------------------------------------
    def load_state_dict(self, state: dict) -> None:
        ranks = state.get("rng_ranks")
        if ranks is not None:
            if len(ranks) != self.size:
                raise ValueError(f"this checkpoint was written by a gang of {len(ranks)} devices; it "
                                 f"resumes on {len(ranks)}, not {self.size}")
            state = {**state, "rng": ranks[self.rank]}
        super().load_state_dict(state)
