"""Write the repository's GitHub path from its one setting into every place that needs it.

The setting is the line ``Repository: https://github.com/<owner>/<repo>`` (or ``Repository:
unset`` while the project has no published home) in docs/pages/contributing.md. From it come
each notebook's Colab badge and the ``REPO`` setting of its install cell (what Colab installs),
and the README's Colab badges. Unset: no badge anywhere and ``REPO = ""``, so that an install cell
run in Colab stops with one line saying what to set. ``python .ci/repo_links.py`` rewrites them;
``--check`` only reports and exits 1 if any disagrees (tests/package/test_notebooks.py checks the same).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTING_FILE = ROOT / "docs" / "pages" / "contributing.md"
BADGE = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/")
BADGE_LINE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
REPO_LINE = re.compile(r'^REPO, REF = "[^"]*", ')


def setting() -> str | None:
    """The ``owner/name`` of the repository, or None while it is unset."""
    text = SETTING_FILE.read_text(encoding="utf-8")
    found = re.findall(r"^Repository:\s*(\S+?)/?\s*$", text, re.M)
    if len(found) != 1:
        raise SystemExit(f"{SETTING_FILE.relative_to(ROOT)} must have one line 'Repository: "
                         "https://github.com/OWNER/NAME' (or 'Repository: unset')")
    if found[0] == "unset":
        return None
    m = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)", found[0])
    if not m:
        raise SystemExit(f"Repository: {found[0]!r} is not https://github.com/OWNER/NAME or 'unset'")
    return m.group(1)


def _notebook_cells(nb: dict, slug: str | None, name: str) -> None:
    head = nb["cells"][0]
    lines = [line for line in head["source"] if BADGE_LINE not in line]
    if slug:   # the badge goes under the title
        badge = f"{BADGE_LINE}(https://colab.research.google.com/github/{slug}/blob/main/notebooks/{name})\n"
        lines[1:1] = ["\n", badge]
    text = re.sub(r"\n{3,}", "\n\n", "".join(lines))
    head["source"] = text.splitlines(keepends=True)
    url = f"https://github.com/{slug}" if slug else ""
    for cell in nb["cells"][1:]:
        cell["source"] = [REPO_LINE.sub(f'REPO, REF = "{url}", ', line) for line in cell["source"]]


def main(check: bool) -> int:
    slug = setting()
    stale = []
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = BADGE.sub(f"https://colab.research.google.com/github/{slug}/blob/", text) if slug else text
    if new != text:
        stale.append(readme)
        if not check:
            readme.write_text(new, encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        raw = path.read_text(encoding="utf-8")
        nb = json.loads(raw)
        _notebook_cells(nb, slug, path.name)
        out = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        if out != raw:
            stale.append(path)
            if not check:
                path.write_text(out, encoding="utf-8")
    for path in stale:
        print(f"{'out of date' if check else 'updated'}: {path.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
