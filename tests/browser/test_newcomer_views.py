"""What a newcomer meets after the quickstart's grid, read in a real browser (JupyterLab + Chromium):
two LoRA configs (r, lora_alpha and target_modules set at once) x two learning rates on a CPU.

- the knobs view draws one plot for the three LoRA knobs, with every label inside its plot and
  none over another;
- the curve tools say why wall-time curves rise in steps, and that smoothing is the train chart's;
- the engine time split shows the CPU's memory figure once, as the process's, on no run's row;
- the HTML report at 1280 px: its knob plots' axis labels do not overlap.

The grid trains to the end first, so each check reads a picture that no longer changes; every
wait is on a condition, never on time. Screenshots go to test-output/browser/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import OUTPUT, experiment_events, run_first_cell, waiter, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "browser-newcomer"
TRAIN = "[data-testid=rf-chart-train]"

NOTEBOOK_CODE = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import DEMO_MODEL_KWARGS, make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(64, 16, task="colors")
loras = List([
    RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    RFLoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"]),
])
config = RFModelConfig(
    model_name="tiny-llama", model_kwargs=DEMO_MODEL_KWARGS, peft_config=loras,
    training_args=RFSFTConfig(learning_rate=List([2e-2, 5e-3]), per_device_train_batch_size=8,
                              num_train_epochs=1, bf16=False, max_length=64, logging_steps=1),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=2,
            sample_prompts=[])
"""

INSPECT = "(sel) => { const d = document.querySelector(sel); return d && d.rfInspect ? d.rfInspect() : null; }"
KNOBS = "(el) => el.querySelector('[data-testid=rf-knob-canvas]').rfInspect()"

_wait = waiter("newcomer_timeout.png", full_page=True)


def _done(root: Path) -> bool:
    status: dict[int, str] = {}
    for e in experiment_events(root, EXPERIMENT):
        if e["type"] == "run_status":
            status[e["run_id"]] = e["status"]
    return len(status) == 4 and all(s == "completed" for s in status.values())


@pytest.fixture(scope="module")
def newcomer(lab, browser):
    """One JupyterLab page with the finished grid's panel, shared by every check here."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    write_notebook(lab.root, EXPERIMENT, "newcomer.ipynb", NOTEBOOK_CODE)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{lab.url}/lab/tree/newcomer.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    run_first_cell(page)
    panel = page.locator("[data-testid=rf-panel]")
    panel.wait_for(timeout=180_000)
    _wait(lambda: _done(lab.root), 600, "the four runs to complete", page)
    last = max(e["seq"] for e in experiment_events(lab.root, EXPERIMENT))
    _wait(lambda: f"seq {last}" in (page.locator("[data-testid=rf-live]").text_content() or ""), 120,
          "the panel to read the whole log", page)
    yield page, panel, lab
    context.close()


def test_knob_view_draws_knobs_that_vary_together_once_with_whole_labels(newcomer):
    page, panel, _ = newcomer
    knobs = panel.locator("[data-testid=rf-knob-canvas]")
    knobs.scroll_into_view_if_needed()
    data = _wait(lambda: (lambda d: d if len(d["points"]) == 8 else None)(panel.evaluate(KNOBS)), 30,
                 "the knob view's 4 runs on 2 plots", page)
    # one plot on r for the three LoRA knobs (not three plots of the same points), one for lr
    assert data["axes"] == ["peft_config.r", "training_args.learning_rate"], data["axes"]
    assert data["linked"]["peft_config.r"] == ["peft_config.lora_alpha", "peft_config.target_modules"]
    note = panel.locator("[data-testid=rf-knob-note]").text_content() or ""
    assert "r, lora_alpha, target_modules vary together" in note, note
    labels = data["labels"]
    titles = [lb["text"] for lb in labels if lb["kind"] == "title"]
    assert " ".join(titles).startswith("r · lora_alpha · target_modules"), titles
    # every label inside its plot and the canvas; no two on one line of one plot overlap
    for lb in labels:
        assert lb["cell"][0] <= lb["x0"] and lb["x1"] <= lb["cell"][1] <= data["width"] + 1, lb
    for knob in data["axes"]:
        ticks = [lb for lb in labels if lb["knob"] == knob and lb["kind"] == "tick"]
        for line in {lb["line"] for lb in ticks}:
            spans = sorted((lb["x0"], lb["x1"]) for lb in ticks if lb["line"] == line)
            assert all(b[0] > a[1] for a, b in zip(spans, spans[1:])), (knob, spans)
    knobs.screenshot(path=str(OUTPUT / "newcomer_knobs.png"))


def test_curve_notes_say_why_wall_time_steps_and_what_smoothing_smooths(newcomer):
    page, panel, _ = newcomer
    bar = panel.locator("[data-testid=rf-curvebar]")
    note = panel.locator("[data-testid=rf-curve-note]")
    assert "smoothing (train)" in (bar.text_content() or "")
    assert not note.is_visible()
    panel.locator("[data-testid=rf-xaxis]").select_option("time")
    _wait(lambda: note.is_visible() and "take turns on the device" in (note.text_content() or ""), 10,
          "the wall-time note", page)
    panel.locator("[data-testid=rf-smoothing]").evaluate(
        "(el) => { el.value = '0.6'; el.dispatchEvent(new Event('input', { bubbles: true })); }")
    _wait(lambda: "smoothing applies to the train chart" in (note.text_content() or ""), 10, "the smoothing note", page)
    panel.locator(TRAIN).scroll_into_view_if_needed()
    page.screenshot(path=str(OUTPUT / "newcomer_wall_time_note.png"))
    panel.locator("[data-testid=rf-xaxis]").select_option("samples")
    panel.locator("[data-testid=rf-smoothing]").evaluate(
        "(el) => { el.value = '0'; el.dispatchEvent(new Event('input', { bubbles: true })); }")
    _wait(lambda: not note.is_visible(), 10, "no note with the default settings", page)


def test_time_split_shows_the_cpu_memory_once_as_the_process_s(newcomer):
    page, panel, lab = newcomer
    devices = {e.get("device") for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "chunk_done"}
    if any(str(d).startswith("cuda") for d in devices):
        pytest.skip("trained on CUDA: each run's memory is its own there")
    res = panel.locator("[data-testid=rf-time-res]")
    _wait(lambda: res.count() == 5 and "tok/s" in (res.nth(1).text_content() or ""), 30,
          "the time split's all-runs row and four run rows", page)
    texts = [res.nth(i).text_content() or "" for i in range(res.count())]
    assert texts[0].startswith("process ") and "MB" in texts[0], texts
    assert all("MB" not in t and "GB" not in t for t in texts[1:]), texts
    assert "no run's own memory" in (res.nth(0).get_attribute("title") or "")


def test_report_knob_labels_do_not_overlap_at_1280_px(newcomer, browser, tmp_path):
    _, _, lab = newcomer
    out = tmp_path / "newcomer.html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(lab.root / "experiments" / EXPERIMENT),
                           "-o", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1, offline=True)
    page = context.new_page()
    try:
        page.goto(out.as_uri())
        page.wait_for_function("document.querySelector('#knobs-scatter .main-svg .xtick text')", timeout=60_000)
        fig = page.locator("#knobs-scatter")
        fig.scroll_into_view_if_needed()
        boxes = page.evaluate("""() => {
            const root = document.getElementById('knobs-scatter');
            const plot = root.getBoundingClientRect();
            const out = [];
            for (const layer of root.querySelectorAll('.xaxislayer-above, .subplot .xaxislayer-above')) {
              const ticks = [...layer.querySelectorAll('.xtick text')].map((t) => {
                const b = t.getBoundingClientRect();
                return [b.left, b.right, b.top, b.bottom, t.textContent];
              });
              out.push(ticks);
            }
            const titles = [...root.querySelectorAll('.annotation-text')].map((t) => {
              const b = t.getBoundingClientRect();
              return [b.left, b.right, t.textContent];
            });
            return { width: plot.width, left: plot.left, right: plot.right, axes: out, titles };
        }""")
        names = page.evaluate("() => document.getElementById('knobs-scatter').data.map((t) => t.name)")
        assert names == ["r", "learning_rate"], names
        assert any(t[2].startswith("r · lora_alpha · target_modules") for t in boxes["titles"]), boxes["titles"]
        ticks = [t for axis in boxes["axes"] for t in axis]
        assert ticks, boxes
        for axis in boxes["axes"]:
            spans = sorted((t[0], t[1]) for t in axis if t[4])
            assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), spans
        for left, right, *_ in ticks:
            assert boxes["left"] - 1 <= left and right <= boxes["right"] + 1, (left, right, boxes["left"], boxes["right"])
        fig.screenshot(path=str(OUTPUT / "newcomer_report_knobs.png"))
        # the leaderboard's last column, the user's note, ends inside the window: it wraps
        # instead of being pushed past the edge by the long knob values before it
        edge = page.evaluate("""() => { const ths = [...document.querySelectorAll('table th')];
            const last = ths[ths.length - 1];
            return [last.textContent, last.getBoundingClientRect().right, document.documentElement.clientWidth]; }""")
        headers = page.evaluate("() => [...document.querySelectorAll('table th')].map((h) => [h.textContent, Math.round(h.getBoundingClientRect().right)])")
        assert edge[0] == "note" and edge[1] <= edge[2], (edge, headers)
    finally:
        context.close()
