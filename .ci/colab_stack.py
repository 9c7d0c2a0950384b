"""Colab's published runtime as data, for CI's Colab job (.ci/colab-stack).

``.ci/colab/pip-freeze.gpu.txt`` is Google Colab's own ``pip freeze`` of its GPU runtime (see
``.ci/colab/README.md`` for where it comes from). This module turns it into what the job needs:

- ``plant SITE``: a *stand-in* of Colab's installed packages inside a venv's site-packages: one
  ``.dist-info`` folder with Name and Version per frozen package, no code. pip then treats them as
  installed, so ``pip install --dry-run --report`` answers the question a Colab user's
  ``%pip install`` answers: what would change in *that* environment (pip keeps an installed
  version that satisfies a requirement), with no torch or other package downloaded.
- ``check REPORT``: reads pip's installation report against the freeze; prints every package the
  install adds or changes (from -> to, who requires it, download size when ``--sizes``) and
  exits non-zero if any kernel-stack package would change.
- ``constraints [--except NAME ...] [--except-report REPORT]``: the freeze as pip constraints
  (local versions such as ``+cu128`` stripped, ``name @ url`` lines dropped, torch left out: CI
  installs the CPU build), without what the install changes.
- ``held``: the install cell's constraints in this environment; ``verify``: this venv has Colab's
  exact kernel stack; ``imports``: import what needs no third-party package (Python 3.12/3.13).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

FREEZE = Path(__file__).parent / "colab" / "pip-freeze.gpu.txt"

# What a %pip install in Colab must leave exactly as it is: the kernel, its widget stack, the
# notebook server, and the two big binaries everything else is built against.
KERNEL_STACK = (
    "ipykernel", "ipython", "ipywidgets", "widgetsnbextension", "jupyterlab-widgets",
    "jupyter-client", "jupyter-core", "jupyter-server", "notebook", "traitlets", "tornado",
    "pyzmq", "prompt-toolkit", "anywidget", "numpy", "torch",
)


# What the notebooks' install cell holds at the installed version (its `held` list must equal this):
# the kernel stack, and huggingface_hub, which Colab's transformers, diffusers, gradio and
# sentence-transformers are built against (datasets would otherwise take it to a new major).
HELD = KERNEL_STACK + ("huggingface-hub",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_freeze(path: Path = FREEZE) -> dict[str, tuple[str, str]]:
    """canonical name -> (name as frozen, version without a local part)."""
    out: dict[str, tuple[str, str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or " @ " in line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m is None:
            raise SystemExit(f"{path}: cannot read the line {line!r}")
        out[canonical(m.group(1))] = (m.group(1), m.group(2).split("+", 1)[0])
    missing = [n for n in KERNEL_STACK if n not in out]
    if missing:
        raise SystemExit(f"{path}: no version for the kernel-stack packages {missing}")
    return out


def plant(site: Path, freeze: dict[str, tuple[str, str]]) -> int:
    """Write one metadata-only .dist-info per frozen package into ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    for name, version in freeze.values():
        d = site / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir(exist_ok=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (d / "INSTALLER").write_text("colab-freeze\n")
        (d / "RECORD").write_text("")
    return len(freeze)


def _requirers(report: dict) -> dict[str, list[str]]:
    """canonical name -> the packages of the install (or the project itself) that require it."""
    by: dict[str, list[str]] = {}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        who = meta.get("name", "?")
        for req in meta.get("requires_dist") or []:
            if ";" in req and "extra ==" in req.split(";", 1)[1]:
                continue
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)", req)
            if m:
                spec = m.group(2).strip().replace(" ", "")
                by.setdefault(canonical(m.group(1)), []).append(f"{who} ({spec or 'any'})")
    return by


def _size(url: str) -> int | None:
    if url.startswith("file:"):   # a local mirror of the index: the same file
        try:
            return Path(urllib.request.url2pathname(url[5:])).stat().st_size
        except OSError:
            return None
    try:
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=20) as r:
            return int(r.headers.get("Content-Length") or 0) or None
    except Exception:
        return None


def changes(report: dict, freeze: dict[str, tuple[str, str]], sizes: bool = False) -> list[dict]:
    """What the reported install adds or changes, relative to the freeze."""
    req = _requirers(report)
    out = []
    for item in report.get("install", []):
        meta = item["metadata"]
        name = canonical(meta["name"])
        info = item.get("download_info") or {}
        url = info.get("url", "")
        if "dir_info" in info or "vcs_info" in info:
            continue   # the project itself (a checkout, or git+https:// as the notebooks install it)
        before = freeze.get(name, (None, None))[1]
        out.append({
            "name": meta["name"], "from": before, "to": meta["version"],
            "required_by": sorted(set(req.get(name, []))),
            "bytes": _size(url) if sizes and url else None,
        })
    return sorted(out, key=lambda c: c["name"].lower())


def held() -> list[str]:
    """The constraints the install cell writes: each held package at its installed version."""
    from importlib import metadata

    out = []
    for name in HELD:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return out


def imports(root: Path) -> int:
    """Import every module of the package that this interpreter can import without torch or the
    other third-party dependencies (none are installed in pyenv's bare interpreters). The
    package's ``__init__`` (which checks TRL's version) is skipped by registering the package
    folder directly; a module is counted as skipped only when a *third-party* import is missing."""
    import importlib
    import importlib.util
    import types

    failures, done, skipped = [], 0, 0
    for pkg in ("rapidfire_nb", "rapidfire"):
        top = types.ModuleType(pkg)
        top.__path__ = [str(root / pkg)]
        sys.modules[pkg] = top
    for path in sorted((root / "rapidfire_nb").rglob("*.py")) + [root / "rapidfire" / "__init__.py"]:
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts in (["rapidfire_nb"], ["rapidfire"]) or parts[-1] == "__main__":
            continue
        name = ".".join(parts)
        try:
            importlib.import_module(name)
            done += 1
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing in ("rapidfire_nb", "rapidfire") or not missing:
                failures.append(f"{name}: {exc}")
            else:
                skipped += 1
        except Exception as exc:   # a syntax or runtime error on this Python
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    print(f"Python {sys.version.split()[0]}: {done} modules imported, {skipped} need a "
          f"third-party package not installed here")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures or done == 0 else 0


def verify(freeze: dict[str, tuple[str, str]]) -> int:
    """In the Python 3.11 venv: every kernel-stack package (but torch, the CPU build here) is
    installed at exactly Colab's version."""
    from importlib import metadata

    bad = []
    for name in KERNEL_STACK:
        if name == "torch":
            continue
        want = freeze[name][1]
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != want:
            bad.append(f"{name}: Colab has {want}, this venv {have}")
        else:
            print(f"  {name}=={have}")
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plant")
    p.add_argument("site", type=Path)
    c = sub.add_parser("check")
    c.add_argument("report", type=Path)
    c.add_argument("--sizes", action="store_true", help="ask the index for each download's size")
    k = sub.add_parser("constraints")
    k.add_argument("--except", dest="skip", nargs="*", default=[])
    k.add_argument("--except-report", type=Path, help="leave out what this pip report installs")
    sub.add_parser("held")
    sub.add_parser("imports")
    sub.add_parser("verify")
    args = ap.parse_args(argv)
    if args.cmd == "held":
        print("\n".join(held()))
        return 0
    if args.cmd == "imports":
        return imports(Path(__file__).resolve().parent.parent)
    freeze = read_freeze()
    if args.cmd == "verify":
        return verify(freeze)

    if args.cmd == "plant":
        print(f"planted {plant(args.site, freeze)} packages of Colab's freeze into {args.site}")
        return 0
    if args.cmd == "constraints":
        skip = {canonical(s) for s in args.skip} | {"torch"}
        if args.except_report:
            report = json.loads(args.except_report.read_text(encoding="utf-8"))
            skip |= {canonical(i["metadata"]["name"]) for i in report.get("install", [])}
        print("\n".join(f"{n}=={v}" for c_, (n, v) in sorted(freeze.items()) if c_ not in skip))
        return 0

    report = json.loads(args.report.read_text(encoding="utf-8"))
    found = changes(report, freeze, sizes=args.sizes)
    total = 0
    print(f"{'package':28} {'Colab has':>12} -> {'install':12} {'download':>9}  required by")
    for ch in found:
        b = ch["bytes"]
        size = (f"{b / 1e6:.1f} MB" if b >= 1e5 else f"{b / 1e3:.0f} kB") if b else \
            "?" if args.sizes else ""
        total += ch["bytes"] or 0
        print(f"{ch['name']:28} {ch['from'] or '(new)':>12} -> {ch['to']:12} {size:>9}  "
              + "; ".join(ch["required_by"]))
    if args.sizes:
        print(f"{len(found)} packages, {total / 1e6:.1f} MB to download")
    broken = [ch for ch in found if canonical(ch["name"]) in KERNEL_STACK]
    for ch in broken:
        print(f"FAIL: the install changes Colab's kernel stack: {ch['name']} {ch['from']} -> {ch['to']}",
              file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
