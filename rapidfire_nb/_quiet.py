"""Quiet imports shared by the notebook extension and the command line."""

from __future__ import annotations

import logging


def import_peft_quietly() -> None:
    """peft imports bitsandbytes, whose CPU backend logs a warning at import when the optional
    ``kernels`` package is missing ("Failed to load CPU gemm_4bit_forward ..."): harmless, but it
    reads like a failure at the top of a cell or of ``rapidfire demo``. Import peft once, with
    bitsandbytes' logger raised to ERROR for that import only."""
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import peft  # noqa: F401
    except Exception:  # a broken peft shows its own error where it is used
        pass
    finally:
        logger.setLevel(level)
