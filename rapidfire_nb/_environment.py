"""The one place that knows which front-end this process runs in: Colab, VS Code, a Jupyter
kernel, or a terminal/script. The display (panel, TensorBoard) and ``run_fit``'s default
blocking follow from it."""

from __future__ import annotations

import os
import sys


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    try:
        return get_ipython()
    except Exception:   # an IPython half torn down at exit
        return None


def in_kernel() -> bool:
    """True inside a Jupyter/Colab/VS Code kernel (a shell with a kernel), not in a terminal
    IPython or a script."""
    shell = _shell()
    return shell is not None and getattr(shell, "kernel", None) is not None


def cell_number() -> int | None:
    """The IPython execution count of the cell running now (None in a script): a mark taken in a
    cell lasts only as long as that cell runs."""
    shell = _shell()
    count = getattr(shell, "execution_count", None) if shell is not None else None
    return count if isinstance(count, int) else None


def frontend() -> str:
    """``colab``, ``vscode``, ``jupyter`` (a kernel, served by Jupyter) or ``terminal``."""
    if "google.colab" in sys.modules:
        return "colab"
    shell = _shell()
    if shell is None or not hasattr(shell, "kernel"):
        return "terminal"
    if "VSCODE_PID" in os.environ or os.environ.get("VSCODE_CWD"):
        return "vscode"
    return "jupyter"
