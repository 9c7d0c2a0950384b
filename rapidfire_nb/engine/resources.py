"""What a chunk used: peak memory and tokens per second, measured around its optimizer steps.

On a CUDA device the peak is ``torch.cuda.max_memory_allocated`` since the chunk began (its
counter is reset at the start, so each chunk reports its own peak: what a T4 user watches to see
how close a config runs to the card's limit). On a CPU there is no allocator counter: the peak
is the process's resident set size at the chunk's end (``/proc/self/statm``, else the
lifetime ``ru_maxrss``), which is the memory the OS gives the kernel while it trains.
Tokens are the non-padding tokens the steps trained on (the batches' attention masks).
"""

from __future__ import annotations

import os
import sys
from typing import Any

MB = 1024 * 1024


class MemoryMeter:
    """``start()`` before a chunk's steps, ``peak_mb()`` after them."""

    def __init__(self, device: Any = None):
        self.device = device
        self.cuda = False
        try:
            import torch

            dev = torch.device(device) if device is not None else None
            self.cuda = dev is not None and dev.type == "cuda" and torch.cuda.is_available()
        except Exception:  # noqa: BLE001 - a device string torch does not know: measure RSS
            self.cuda = False

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self) -> float | None:
        try:
            if self.cuda:
                import torch

                return torch.cuda.max_memory_allocated(self.device) / MB
            return rss_mb()
        except Exception:  # noqa: BLE001 - a measurement must never fail a run
            return None


def rss_mb() -> float | None:
    """The process's resident set size now, in MB (None where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # kilobytes on Linux, bytes on macOS
        return peak / MB if sys.platform == "darwin" else peak / 1024
    except Exception:  # noqa: BLE001
        return None


def batch_tokens(batch: Any) -> int:
    """Non-padding tokens of one collated batch: the sum of its attention masks (DPO batches
    have one per side), else the size of its input ids."""
    if not isinstance(batch, dict):
        return 0
    masks = [v for k, v in batch.items() if k.endswith("attention_mask") and hasattr(v, "sum")]
    if masks:
        return int(sum(int(m.sum()) for m in masks))
    ids = [v for k, v in batch.items() if k.endswith("input_ids") and hasattr(v, "numel")]
    return int(sum(int(i.numel()) for i in ids))
