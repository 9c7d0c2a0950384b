"""Write the repository's GitHub path from its one setting into every place that needs it.

The setting is README.md's line ``Repository: https://github.com/<owner>/<repo>``. From it come
the README's Colab badges, each notebook's badge and the ``REPO`` setting of its install cell
(what Colab installs). ``python .ci/repo_links.py`` rewrites them; ``--check`` only reports and
exits 1 if any disagrees (tests/test_notebooks.py checks the same).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BADGE = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/")
REPO_LINE = re.compile(r'^REPO, REF = "https://github\.com/[\w.-]+/[\w.-]+", ')


def setting() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"^Repository:\s*https://github\.com/([\w.-]+/[\w.-]+?)/?\s*$", text, re.M)
    if len(found) != 1:
        raise SystemExit("README.md must have one line 'Repository: https://github.com/OWNER/NAME'")
    return found[0]


def main(check: bool) -> int:
    slug = setting()
    badge = f"https://colab.research.google.com/github/{slug}/blob/"
    stale = []
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = BADGE.sub(badge, text)
    if new != text:
        stale.append(readme)
        if not check:
            readme.write_text(new, encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        raw = path.read_text(encoding="utf-8")
        nb = json.loads(raw)
        for cell in nb["cells"]:
            cell["source"] = [REPO_LINE.sub(f'REPO, REF = "https://github.com/{slug}", ',
                                            BADGE.sub(badge, line)) for line in cell["source"]]
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
