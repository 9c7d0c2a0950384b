"""Residency: which runs keep their own state (adapter or model copy, optimizer state) on the device.

Policy from ``Experiment(offload=...)``. "never": all stay on the device (a swap then moves
nothing). "always": only the run in training is on the device. "auto" (default): on a CUDA device,
park runs in host memory only while free memory is short of what the next run needs, those the
scheduler will come back to last first; elsewhere, nothing moves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from rapidfire_nb.engine.adapters.base import RunTrainer
from rapidfire_nb.engine.scheduling import RunView, parking_order


class Residency:
    def __init__(self, offload: str = "auto", host: str = "cpu"):
        self.offload = offload
        self.host = host                 # where parked runs live
        self.peak_extra = 0              # largest memory a chunk added (CUDA, bytes)
        self.parks_done = 0

    def make_room(self, rt: RunTrainer, others: list[tuple[RunTrainer, float]]) -> None:
        """Before ``rt`` trains: park the resident ``others`` (each with its progress) as the policy
        says. ``others`` holds only runs that may move now (not parked, no checkpoint in flight)."""
        if self.offload == "never" or not others:
            return
        if self.offload == "always":
            for other, _ in others:
                self.park(other)
            return
        device = rt.args.device
        if device.type != "cuda":
            return
        import torch

        free, total = torch.cuda.mem_get_info(device)
        headroom = self.peak_extra if self.peak_extra else int(0.10 * total)
        need = rt.parked_bytes() + headroom

        def available() -> int:
            free, _ = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return free + cached - int(0.05 * total)

        by_id = {other.record.run_id: other for other, _ in others}
        for rid in parking_order(RunView(other.record.run_id, progress, True) for other, progress in others):
            if available() >= need:
                break
            self.park(by_id[rid])

    def park(self, rt: RunTrainer) -> None:
        try:
            rt.park(self.host)
            self.parks_done += 1
        except Exception as exc:   # e.g. no pinned host memory left: it just stays resident
            warnings.warn(f"run {rt.record.run_id} could not be moved to host memory "
                          f"({type(exc).__name__}: {exc}); it stays on the device", stacklevel=2)

    def memory_probe(self, rt: RunTrainer) -> Callable[[], None] | None:
        """On CUDA with "auto", call at a chunk's start; the returned function, called at its end,
        records what the chunk added on top of the memory allocated when it started, known exactly
        when the chunk set a new process-wide peak (the peak is read, never reset: other code,
        ``rapidfire bench`` or the user's, may be measuring it)."""
        if self.offload != "auto" or rt.args.device.type != "cuda":
            return None
        import torch

        device = rt.args.device
        start = torch.cuda.memory_allocated(device)
        peak_before = torch.cuda.max_memory_allocated(device)

        def record() -> None:
            peak = torch.cuda.max_memory_allocated(device)
            if peak > peak_before:
                self.peak_extra = max(self.peak_extra, peak - start)

        return record
