"""The library versions this package is tested with, checked when it is imported.

The engine drives private pieces of TRL, transformers and accelerate (each trainer adapter lists
the ones it touches at its top), and those change between releases. A version outside the tested
range fails here, at import, with the range named, instead of as an obscure failed run later.
Set ``RAPIDFIRE_SKIP_VERSION_CHECK=1`` to try an untested version at your own risk.
"""

from __future__ import annotations

import os
from importlib import metadata

# distribution -> (lowest tested, first release not yet supported); mirrored in pyproject.toml
SUPPORTED = {
    "trl": ("1.16", "2"),
    "transformers": ("5.3", "6"),
    "peft": ("0.18", "1"),
    "accelerate": ("1.10.1", "2"),
    "datasets": ("4.7", "6"),
}


class UnsupportedVersionError(ImportError):
    pass


def unsupported(installed: dict[str, str | None]) -> list[str]:
    """One line per distribution whose installed version is outside its supported range."""
    from packaging.version import InvalidVersion, Version

    problems = []
    for dist, (low, high) in SUPPORTED.items():
        have = installed.get(dist)
        if have is None:
            problems.append(f"{dist} is not installed (supported: >={low},<{high})")
            continue
        try:
            v = Version(have)
        except InvalidVersion:
            problems.append(f"{dist} {have!r} is not a version this check can read (supported: >={low},<{high})")
            continue
        if not Version(low) <= Version(v.base_version) < Version(high):
            problems.append(f"{dist} {have} is installed; rapidfire_nb supports {dist}>={low},<{high}")
    return problems


def installed_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in SUPPORTED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def check_versions() -> None:
    if os.environ.get("RAPIDFIRE_SKIP_VERSION_CHECK") == "1":
        return
    problems = unsupported(installed_versions())
    if problems:
        raise UnsupportedVersionError(
            "rapidfire_nb cannot run with these library versions:\n  " + "\n  ".join(problems)
            + "\nInstall supported ones, e.g. pip install "
            + " ".join(f"'{d}>={lo},<{hi}'" for d, (lo, hi) in SUPPORTED.items())
            + "\n(or set RAPIDFIRE_SKIP_VERSION_CHECK=1 to try anyway)")
