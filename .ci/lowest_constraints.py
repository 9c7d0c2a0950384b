"""Print pip constraints that pin every dependency of pyproject.toml to its lower bound.

CI's lowest-version job installs the package with these (``pip install -c``), so the engine's
tests run against the oldest releases the package claims to support, not only the newest.
Usage: python .ci/lowest_constraints.py [EXTRA ...] > constraints.txt
(``torch`` is left out: CI pins the build itself.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SKIP = {"torch"}


def floors(requirements: list[str]) -> list[str]:
    pins = []
    for req in requirements:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", req.split(";")[0])
        if not m:
            raise SystemExit(f"pyproject.toml: cannot read the requirement {req!r}")
        name, spec = m.group(1), m.group(3)
        if name.lower() in SKIP or name.startswith("rapidfire"):
            continue
        low = re.search(r">=\s*([0-9][^,\s]*)", spec)
        if low is None:
            raise SystemExit(f"pyproject.toml: {req!r} has no lower bound (>=) to test against")
        pins.append(f"{name}=={low.group(1)}")
    return pins


def main(extras: list[str]) -> None:
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    print("\n".join(sorted(set(floors(reqs)), key=str.lower)))


if __name__ == "__main__":
    main(sys.argv[1:])
