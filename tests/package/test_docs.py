"""The documentation site (docs/): it builds with ``mkdocs build --strict``, serves nothing from
outside, and every code block on it that can run offline runs.

Code blocks run page by page, in page order, in one IPython shell per page (so ``%rapidfire``
magics work and later blocks see what earlier ones defined), from a temporary folder. Hub names
are mapped to local look-alikes: ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained`` of a
name that is not a folder load a tiny model saved under that name, and ``datasets.load_dataset``
of the datasets the pages name returns in-code rows of the same shape (tests/helpers.py).

The pages show realistic sizes (2,000 training rows, a 256-row offline task); the test shrinks
them as it runs each block (``shrink``): the row counts of ``.select(range(...))`` and
``make_demo_datasets(...)`` become a few dozen rows, so every block runs the same code path in seconds, not the quick start's
1,000 training steps. Nothing else in a block changes.

A block that cannot run offline carries a comment on the line before it::

    <!-- docs-test: skip (why) -->

Runnable languages are ``python`` and ``bash``; other fences (``text``) are output or layout and
are not counted. Each page's test says how many blocks it ran and skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: builds the site and runs every offline code block

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = DOCS / "pages"
RUNNABLE = ("python", "bash")

_FENCE = re.compile(r"^```\s*\{?\s*\.?([A-Za-z0-9_+-]*)")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")


@dataclass
class Block:
    page: str
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None   # the reason, for a block marked skip


def page_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{start + 1}: unclosed code fence")
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = _MARK.match(prev)
        skip = None
        if mark and mark.group(1).startswith("skip"):
            skip = mark.group(1)[len("skip"):].strip(" :()") or ""
            assert skip, f"{path.name}:{start + 1}: a skipped block must say why: <!-- docs-test: skip (why) -->"
        blocks.append(Block(path.name, start + 1, lang, "\n".join(lines[start + 1:j]), skip))
        i = j + 1
    return blocks


def nav_pages() -> list[str]:
    """The pages in nav order, as mkdocs.yml lists them (relative to docs/pages)."""
    return re.findall(r":\s*([\w/.-]+\.md)\s*$", (DOCS / "mkdocs.yml").read_text(encoding="utf-8"), re.M)


PAGE_NAMES = nav_pages()


def _report(request, text: str) -> None:
    """One line on the terminal even under -q (pytest's capture would hide a print)."""
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return
    with cap.global_and_fixture_disabled() if cap is not None else contextlib.nullcontext():
        tr.write_line(text)


# -- offline stand-ins for the hub, and the sizes the test runs at ------------------------------

TRAIN_ROWS, EVAL_ROWS = 48, 16   # the test's data sizes: a few optimizer steps per chunk


def _small_select(m: re.Match) -> str:
    if m.group(2) is None:                             # select(range(n)): the training rows
        return f"select(range({min(int(m.group(1)), TRAIN_ROWS)}))"
    start, end = int(m.group(1)), int(m.group(2))        # select(range(a, b)): eval rows after them
    start, end = min(start, TRAIN_ROWS), min(start, TRAIN_ROWS) + min(end - start, EVAL_ROWS)
    return f"select(range({start}, {end}))"


_SHRINK = [
    (re.compile(r"select\(range\((\d+)(?:,\s*(\d+))?\)\)"), _small_select),
    (re.compile(r"make_demo_datasets\((\d+),\s*(\d+)\)"),
     lambda m: f"make_demo_datasets({min(int(m.group(1)), TRAIN_ROWS)}, {min(int(m.group(2)), EVAL_ROWS)})"),
]


def shrink(code: str) -> str:
    """A block's code at the test's data sizes (see the module docstring)."""
    for pattern, small in _SHRINK:
        code = pattern.sub(small, code)
    return code


def test_shrink_keeps_the_code_and_cuts_only_row_counts():
    quick = ('train, evald = data.select(range(2000)), data.select(range(2000, 2100))\n'
             'train, evald = make_demo_datasets(256, 32)\n'
             'for i in range(3): pass\n')
    assert shrink(quick) == (f'train, evald = data.select(range({TRAIN_ROWS})), '
                             f'data.select(range({TRAIN_ROWS}, {TRAIN_ROWS + EVAL_ROWS}))\n'
                             f'train, evald = make_demo_datasets({TRAIN_ROWS}, {EVAL_ROWS})\n'
                             'for i in range(3): pass\n')
    # the quick start's data is built in a form shrink knows: if the page changed that form, the
    # test would quietly train its 1,000 steps again
    quick_start = [b for b in page_blocks(PAGES / "getting-started.md")
                   if b.lang == "python" and b.skip is None and "load_dataset(" in b.code]
    assert quick_start and all(shrink(b.code) != b.code for b in quick_start), \
        "getting-started.md's quick start no longer builds its data with .select(range(...))"


def _dataset_standins():
    from helpers import customer_support_rows, gsm8k_rows, ultrafeedback_rows

    return {
        "bitext/Bitext-customer-support-llm-chatbot-training-dataset": lambda: customer_support_rows(TRAIN_ROWS + EVAL_ROWS),
        "trl-lib/ultrafeedback_binarized": lambda: ultrafeedback_rows(64),
        "openai/gsm8k": lambda: gsm8k_rows(64),
    }


@pytest.fixture
def hub_standins(monkeypatch, tmp_path_factory):
    import datasets
    import transformers
    from helpers import local_model_dir

    root = tmp_path_factory.mktemp("docs-hub")
    standins = _dataset_standins()

    def local(name):
        return name if os.path.isdir(str(name)) else local_model_dir(root, str(name))

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        original = cls.from_pretrained
        monkeypatch.setattr(cls, "from_pretrained",
                            lambda name, *a, _orig=original, **k: _orig(local(name), *a, **k))

    def load_dataset(name, *args, split=None, keep_in_memory=None, **kwargs):
        if name not in standins:
            raise AssertionError(f"the docs load dataset {name!r}, which has no offline stand-in in "
                                 "tests/package/test_docs.py: add one")
        rows = standins[name]()
        return rows if split is not None else datasets.DatasetDict({"train": rows})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


# -- the build ---------------------------------------------------------------------------------

def test_every_page_is_in_the_nav_and_every_block_is_run_or_marked(request):
    on_disk = sorted(str(p.relative_to(PAGES)) for p in PAGES.rglob("*.md"))
    assert sorted(PAGE_NAMES) == on_disk, "docs/mkdocs.yml's nav and docs/pages/ disagree"
    ran = skipped = 0
    for name in PAGE_NAMES:
        for b in page_blocks(PAGES / name):
            if b.lang not in RUNNABLE:
                continue
            if b.skip is None:
                ran += 1
            else:
                skipped += 1
    assert ran >= 20, f"only {ran} runnable code blocks on the site"
    _report(request, f"docs: {ran + skipped} code blocks on {len(PAGE_NAMES)} pages: "
                     f"{ran} run by test_docs, {skipped} marked as not runnable offline")


def test_strict_build_is_clean_and_serves_nothing_from_outside(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(DOCS / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "WARNING" not in out, out[-6000:]
    for name in PAGE_NAMES:
        html = site / (name[:-3] + "/index.html" if name != "index.md" else "index.html")
        assert html.exists(), f"{name} was not built ({html})"
    # the API pages carry the docstrings (mkdocstrings rendered them, not an empty stub)
    api = (site / "api" / "experiment" / "index.html").read_text(encoding="utf-8")
    for text in ("run_fit", "clone_modify", "get_runs_info", "Expand and validate"):
        assert text in api, f"API reference lacks {text!r}"
    automl = (site / "api" / "automl" / "index.html").read_text(encoding="utf-8")
    for text in ("RFGridSearch", "RFRandomSearch", "RFOptuna", "n_initial", "Range"):
        assert text in automl, f"API reference of automl lacks {text!r}"
    # nothing is loaded from another host when a page is viewed: no fonts, scripts, styles or
    # images from outside (links a reader may click are fine)
    external = re.compile(r"""<(?:script|img|iframe|source|video|audio|embed)\b[^>]*\bsrc=["']?(?:https?:)?//"""
                          r"""|<link\b[^>]*\bhref=["']?(?:https?:)?//"""
                          r"""|url\(\s*["']?(?:https?:)?//|@import\s+["']?(?:url\()?["']?(?:https?:)?//""", re.I)
    found = []
    for f in site.rglob("*"):
        if f.suffix in (".html", ".css"):
            for m in external.finditer(f.read_text(encoding="utf-8", errors="replace")):
                found.append(f"{f.relative_to(site)}: {m.group(0)[:120]}")
    assert not found, "the built site loads from outside:\n" + "\n".join(found[:20])


# -- hand-written reference text that must match the code -------------------------------------

def _marked_block(page: str, marker: str) -> str:
    text = (PAGES / page).read_text(encoding="utf-8")
    m = re.search(rf"<!-- {marker} -->\s*```text\n(.*?)\n```", text, re.S)
    assert m, f"{page}: no text block after <!-- {marker} -->"
    return m.group(1)


def test_magic_usage_on_the_api_page_is_the_magic_help():
    from rapidfire_nb.notebook.magics import USAGE

    assert _marked_block("api/magics.md", "magic-usage") == USAGE


# -- the code blocks ---------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGE_NAMES)
def test_code_blocks_run(page, request, tmp_path, monkeypatch, capsys, hub_standins):
    blocks = [b for b in page_blocks(PAGES / page) if b.lang in RUNNABLE]
    runnable = [b for b in blocks if b.skip is None]
    skipped = [b for b in blocks if b.skip is not None]
    if runnable:
        monkeypatch.chdir(tmp_path)
        _run_page(runnable, tmp_path, monkeypatch, capsys)
    why = "; ".join(f"line {b.line}: {b.skip}" for b in skipped)
    _report(request, f"docs/pages/{page}: ran {len(runnable)} code block(s), skipped {len(skipped)}"
                     + (f" ({why})" if why else ""))


def _run_page(blocks: list[Block], tmp_path: Path, monkeypatch, capsys) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from rapidfire_nb.experiment import Experiment

    created: list = []
    original_init = Experiment.__init__

    def tracking_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(Experiment, "__init__", tracking_init)
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    shell.colors = "NoColor"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           # the console scripts (rapidfire ...) of the environment that runs the tests
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    try:
        for b in blocks:
            where = f"docs/pages/{b.page}:{b.line}"
            if b.lang == "bash":
                proc = subprocess.run(["bash", "-euo", "pipefail", "-c", shrink(b.code)], cwd=tmp_path, env=env,
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, f"{where} (bash) exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                continue
            result = shell.run_cell(shrink(b.code), store_history=False, silent=False)
            out, err = capsys.readouterr()
            error = result.error_before_exec or result.error_in_exec
            assert error is None, f"{where} raised {error!r}:\n{out[-4000:]}\n{err[-2000:]}"
            # a refused magic prints one '%rapidfire: ...' line instead of raising
            assert "%rapidfire:" not in err, f"{where}: a magic was refused:\n{err[-2000:]}"
    finally:
        for exp in created:
            if not exp._ended:
                exp.end(wait=False)
        InteractiveShell.clear_instance()


def test_no_stale_claims_in_front_of_users():
    """Sentences found false on the screen stay out of the README, the docs and the notebooks:
    clicks during a busy cell depend on the kernel (tests/browser/test_panel_busy_cell.py), the
    demo's duration is measured in one place (the README; the demo prints its own), and export
    may write inside the experiment folder (the notebooks do)."""
    stale = ["Buttons act while no cell is running", "under a minute of training",
             "About 2 minutes on 2 CPU cores", "(at once if it is not on\n  the device)",
             "new or empty directory outside the experiment folder;", "OWNER/rapidfire-nb",
             # the panel screenshot (tests/browser/test_panel_browser.py) hovers no row
             "highlighted by hovering its row",
             # the demo and the quickstart are timed where they run (the demo prints its own),
             # the quickstart sized by time (MINUTES)
             "About four minutes", "215 s of CPU time", "673 s of wall time", "in a minute or two"]
    texts = {p: p.read_text(encoding="utf-8") for p in
             [ROOT / "README.md", *sorted(PAGES.rglob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]}
    for path, text in texts.items():
        flat = " ".join(text.replace("\\n", " ").split())
        for claim in stale:
            assert " ".join(claim.split()) not in flat, f"{path.name}: {claim!r}"
    readme = texts[ROOT / "README.md"]
    assert "prints its own elapsed time" in readme and readme.count("Measured: ") == 1
    # the one measured figure is CPU time (user + sys), which other jobs on the machine change
    # far less than wall time, and says how it was measured
    measured = readme.split("Measured: ", 1)[1].split("\n\n", 1)[0]
    assert "of CPU time" in measured and "`time rapidfire demo`" in measured, measured
    panel = (PAGES / "panel.md").read_text(encoding="utf-8")
    assert (ROOT / "tests" / "browser" / "test_panel_busy_cell.py").is_file() and "test_panel_busy_cell.py" in panel
