"""Comparing configurations in a real browser (JupyterLab + Chromium), one session for all checks:
the curve tools (smoothing keeps the raw curve, log y ticks, the hover listing every run), the colour
key, the knobs -> metric view focusing a run on click, the runs' generations side by side, and the
report's new sections.

A grid of four tiny LoRA runs (two learning rates x two ranks) trains to the end first, so every
check below reads a picture that no longer changes; each check waits on a condition, never on time.
Screenshots go to test-output/browser/ (or $RF_COMPARE_SHOTS).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import experiment_events, run_first_cell, waiter, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("RF_COMPARE_SHOTS") or ROOT / "test-output" / "browser")
EXPERIMENT = "browser-compare"
TRAIN = "[data-testid=rf-chart-train]"
EVAL = "[data-testid=rf-chart-eval]"

NOTEBOOK_CODE = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(96, 16)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=List([4, 8]), lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([3e-3, 3e-4]), per_device_train_batch_size=8,
                              num_train_epochs=1, bf16=False, max_length=64, logging_steps=1),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=3,
            sample_prompts={prompts})
"""
PROMPTS = ["What color is the cat?", "What color is the dog?"]

INSPECT = "(sel) => { const d = document.querySelector(sel); return d && d.rfInspect ? d.rfInspect() : null; }"
# Page coordinates of a data point on a chart, from what its canvas drew last.
POINT_PX = """([sel, x, y]) => {
  const d = document.querySelector(sel);
  const v = d.rfInspect().view;
  const r = d.querySelector('canvas').getBoundingClientRect();
  const px = v.plot.left + (x - v.x[0]) / (v.x[1] - v.x[0]) * v.plot.width;
  const py = v.plot.top + v.plot.height - (y - v.y[0]) / (v.y[1] - v.y[0]) * v.plot.height;
  return [r.left + px, r.top + py];
}"""

_wait = waiter("compare_timeout.png", full_page=True)


def _done(root: Path) -> bool:
    status: dict[int, str] = {}
    for e in experiment_events(root, EXPERIMENT):
        if e["type"] == "run_status":
            status[e["run_id"]] = e["status"]
    return len(status) == 4 and all(s == "completed" for s in status.values())


@pytest.fixture(scope="module")
def compare(lab, browser):
    """One JupyterLab page with the finished experiment's panel, shared by every check here."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    write_notebook(lab.root, EXPERIMENT, "compare.ipynb", NOTEBOOK_CODE.replace("{prompts}", repr(PROMPTS)))
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{lab.url}/lab/tree/compare.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    run_first_cell(page)
    panel = page.locator("[data-testid=rf-panel]")
    panel.wait_for(timeout=180_000)
    _wait(lambda: _done(lab.root), 600, "the four runs to complete", page)
    # the panel has read the whole log: every run's train curve is drawn to its end
    last = max(e["seq"] for e in experiment_events(lab.root, EXPERIMENT))
    _wait(lambda: f"seq {last}" in (page.locator("[data-testid=rf-live]").text_content() or ""), 120,
          "the panel to read the whole log", page)
    _wait(lambda: len((page.evaluate(INSPECT, TRAIN) or {}).get("series", [])) == 4, 60, "four train curves", page)
    yield page, panel, lab
    context.close()


def _paths(page, sel=TRAIN):
    return {p["runId"]: p for p in page.evaluate(INSPECT, sel)["paths"]}


def test_names_and_colour_key(compare):
    page, panel, lab = compare
    names = [s["name"] for s in page.evaluate(INSPECT, TRAIN)["series"]]
    # the id and the two knobs that set the runs apart
    assert names == ["1 · lr 3e-3 · r 4", "2 · lr 3e-3 · r 8", "3 · lr 3e-4 · r 4", "4 · lr 3e-4 · r 8"] or \
        sorted(n.split(" · ", 1)[1] for n in names) == ["lr 3e-3 · r 4", "lr 3e-3 · r 8", "lr 3e-4 · r 4", "lr 3e-4 · r 8"], names
    legend = panel.locator("[data-testid=rf-legend-item]")
    assert legend.count() == 4
    assert [legend.nth(i).text_content() for i in range(4)] == names
    # the key's title has the run's whole config (lora_alpha and target_modules too), the name two knobs
    title = legend.nth(0).get_attribute("title") or ""
    assert title.startswith(names[0].split(" · ")[0] + " · ") and "q_proj+v_proj" not in names[0], title
    panel.locator(".rf-legend").screenshot(path=str(SHOTS / "compare_colour_key.png"))
    legend.nth(2).hover()
    _wait(lambda: [s["focused"] for s in page.evaluate(INSPECT, TRAIN)["series"]] == [False, False, True, False], 10,
          "hovering a key entry to emphasize its run", page)
    # a click on the entry writes a note on the run: it goes to the log and comes back as a mark
    legend.nth(2).click()
    panel.locator("[data-testid=rf-note-input]").fill("lowest loss so far")
    panel.locator("[data-testid=rf-note-save]").click()
    _wait(lambda: legend.nth(2).locator(".rf-legend-note").count() == 1, 30, "the note's mark on run 3's entry", page)
    notes = [e for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "note"]
    assert [(e["run_id"], e["text"]) for e in notes] == [(3, "lowest loss so far")]
    page.mouse.move(5, 5)


def test_multi_run_hover_lists_every_run_at_that_x(compare):
    page, panel, _ = compare
    panel.locator(TRAIN).scroll_into_view_if_needed()
    s1 = next(s for s in page.evaluate(INSPECT, TRAIN)["series"] if s["runId"] == 1)
    k = len(s1["x"]) // 2
    page.mouse.move(*page.evaluate(POINT_PX, [TRAIN, s1["x"][k], s1["y"][k]]))
    tip = panel.locator(f"{TRAIN} [data-testid=rf-tooltip]")
    _wait(lambda: tip.is_visible() and tip.locator(".rf-tip-row").count() == 4, 10, "a hover row per run", page)
    assert tip.locator(".rf-tip-hit .rf-tip-name").text_content().startswith("1 · ")
    assert (tip.locator(".rf-tip-head").text_content() or "") == f"samples seen {s1['x'][k]}"
    rows = [tip.locator(".rf-tip-row").nth(i).locator(".rf-tip-name").text_content() for i in range(4)]
    assert all(" · lr " in r and " · r " in r for r in rows), rows
    values = [float(tip.locator(".rf-tip-row").nth(i).locator(".rf-tip-value").text_content()) for i in range(4)]
    assert values == sorted(values)   # a loss: lowest first
    # the value shown is the one run 1 logged there (not a smoothed one)
    hit_value = float(tip.locator(".rf-tip-hit .rf-tip-value").text_content())
    assert hit_value == pytest.approx(s1["y"][k], rel=1e-4)
    assert "rf-hot" in (panel.locator('tr[data-run-id="1"]').get_attribute("class") or "")
    # the page as it is (an element screenshot would scroll, and the pointer leave the chart)
    page.screenshot(path=str(SHOTS / "compare_hover.png"))
    page.mouse.move(5, 5)
    _wait(lambda: not tip.is_visible(), 10, "the hover to go", page)


def test_smoothing_draws_the_average_and_keeps_the_raw_curve(compare):
    page, panel, _ = compare
    raw = _paths(page)
    assert all(p["smooth"] is None and p["raw"]["alpha"] == 1 for p in raw.values())
    slider = panel.locator("[data-testid=rf-smoothing]")
    slider.evaluate("(el) => { el.value = '0.8'; el.dispatchEvent(new Event('input', { bubbles: true })); }")
    _wait(lambda: all(p["smooth"] is not None for p in _paths(page).values()), 10, "the smoothed curves", page)
    smooth = _paths(page)
    for rid, p in smooth.items():
        # the raw curve is still drawn, whole and faint, exactly where it was
        assert p["raw"]["n"] == raw[rid]["raw"]["n"] and p["raw"]["ySum"] == pytest.approx(raw[rid]["raw"]["ySum"])
        assert p["raw"]["alpha"] < 0.5 and p["smooth"]["alpha"] == 1
        # the smoothed one goes elsewhere (its mean pixel y moved)
        assert p["smooth"]["n"] == p["raw"]["n"]
        assert abs(p["smooth"]["ySum"] - p["raw"]["ySum"]) / p["raw"]["n"] > 0.5
    assert page.evaluate(INSPECT, TRAIN)["curve"]["smoothing"] == pytest.approx(0.8)
    panel.screenshot(path=str(SHOTS / "compare_smoothing.png"))
    # an eval curve (a point per chunk) stays raw: smoothing a few points misplaces each of them
    evals = _paths(page, EVAL)
    assert len(evals) == 4 and all(p["smooth"] is None and p["raw"]["alpha"] == 1 for p in evals.values()), evals
    # the hover shows the logged value first, the smoothed one beside it
    s1 = next(s for s in page.evaluate(INSPECT, TRAIN)["series"] if s["runId"] == 1)
    k = len(s1["x"]) // 2
    panel.locator(TRAIN).scroll_into_view_if_needed()
    page.mouse.move(*page.evaluate(POINT_PX, [TRAIN, s1["x"][k], s1["y"][k]]))
    tip = panel.locator(f"{TRAIN} [data-testid=rf-tooltip]")
    # (run 1's row by its name: the point is on the raw curve, away from the smoothed one drawn bold)
    row = tip.locator(".rf-tip-row").filter(has_text=s1["name"])
    _wait(lambda: tip.is_visible() and row.locator(".rf-tip-smoothed").count() == 1, 10, "a smoothed hover", page)
    assert float(row.locator(".rf-tip-value").text_content()) == pytest.approx(s1["y"][k], rel=1e-4)
    assert row.locator(".rf-tip-smoothed").text_content().startswith("smoothed ")
    page.screenshot(path=str(SHOTS / "compare_after_smoothing_hover.png"))
    page.mouse.move(5, 5)
    _wait(lambda: not tip.is_visible(), 10, "the hover to go", page)


def test_log_y_ticks(compare):
    page, panel, _ = compare
    panel.locator("[data-testid=rf-logy]").check()
    # drawn in log10 units (a loss near 6.2 tops out below 1 there)
    view = _wait(lambda: (lambda c: c["view"] if c["curve"]["logY"] and c["view"]["y"][1] < 1.5 else None)(
        page.evaluate(INSPECT, TRAIN)), 10, "the log y axis drawn", page)
    ys = [y for s in page.evaluate(INSPECT, TRAIN)["series"] for y in s["y"] if y is not None and y > 0]
    # the axis is in log10 units of the values, and its labels are values inside that range
    assert view["y"][0] <= math.log10(min(ys)) and view["y"][1] >= math.log10(max(ys))
    labels = [float(t) for t in view["yTicks"]]
    assert len(labels) >= 2 and all(10 ** view["y"][0] <= v <= 10 ** view["y"][1] for v in labels), view
    # the learning rates (3e-3 and 3e-4, decaying) span decades: ticks at powers of ten
    panel.locator("[data-testid=rf-metric-train]").select_option("learning_rate")
    def powers_of_ten():
        # 1, 2 or 5 times a power of ten, at least two of them powers
        ticks = page.evaluate(INSPECT, TRAIN)["view"]["yTicks"] or []
        mant = [float(t) / 10 ** math.floor(math.log10(float(t)) + 1e-9) for t in ticks]
        ok = all(min(abs(m - k) for k in (1, 2, 5)) < 1e-6 for m in mant)
        return ticks if ok and sum(abs(m - 1) < 1e-6 for m in mant) >= 2 else None

    ticks = _wait(powers_of_ten, 10, "powers of ten on the log axis", page)
    assert "0.001" in ticks, ticks
    panel.screenshot(path=str(SHOTS / "compare_log_y.png"))
    # the eval chart's log axis is readable too: at least three ticks, 1-2-5 values
    panel.locator(EVAL).scroll_into_view_if_needed()
    eticks = _wait(lambda: (lambda c: c["view"]["yTicks"] if c["curve"]["logY"] and len(c["view"]["yTicks"] or []) >= 3 else None)(
        page.evaluate(INSPECT, EVAL)), 10, "three or more ticks on the eval chart's log axis", page)
    assert len(set(eticks)) == len(eticks), eticks
    panel.screenshot(path=str(SHOTS / "compare_after_log_y.png"))
    panel.locator("[data-testid=rf-metric-train]").select_option("loss")
    # the settings are remembered: a re-rendered panel comes back with them
    prefs = page.evaluate("() => Object.entries(localStorage).filter(([k]) => k.startsWith('rapidfire-panel-view:'))")
    assert any('"smoothing":0.8' in v and '"logY":true' in v for _, v in prefs), prefs
    panel.locator("[data-testid=rf-logy]").uncheck()
    panel.locator("[data-testid=rf-xaxis]").select_option("step")
    _wait(lambda: page.evaluate(INSPECT, TRAIN)["series"][0]["x"][:2] == [1, 2], 10, "curves against the optimizer step", page)
    # wall time: a chunk's steps spread over the chunk, so no two points of a curve share an x
    samples_x = {s["runId"]: s["x"] for s in page.evaluate(INSPECT, TRAIN)["series"]}
    panel.locator("[data-testid=rf-xaxis]").select_option("time")
    def spread_in_time():
        series = page.evaluate(INSPECT, TRAIN)["series"]
        ok = series and all(len(s["x"]) > 3 and len(set(s["x"])) == len(s["x"]) and s["x"] != samples_x.get(s["runId"])
                            for s in series)
        return series if ok else None
    _wait(spread_in_time, 10, "train curves against wall time, one x per step", page)
    panel.locator(TRAIN).scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "compare_after_wall_time.png"))
    panel.locator("[data-testid=rf-xaxis]").select_option("samples")
    panel.locator("[data-testid=rf-smoothing]").evaluate(
        "(el) => { el.value = '0'; el.dispatchEvent(new Event('input', { bubbles: true })); }")


def test_knob_view_focuses_a_run_on_click(compare):
    page, panel, _ = compare
    knobs = panel.locator("[data-testid=rf-knob-canvas]")
    knobs.scroll_into_view_if_needed()
    inspect = "(el) => el.querySelector('[data-testid=rf-knob-canvas]').rfInspect()"
    data = _wait(lambda: (lambda d: d if d["points"] else None)(panel.evaluate(inspect)), 20, "the knob view", page)
    assert sorted(data["axes"]) == ["peft_config.r", "training_args.learning_rate"]   # lora_alpha never varies
    assert data["metric"] == "eval_loss" and data["missing"] == []
    target = next(p for p in data["points"] if p["runId"] == 3 and p["knob"] == "training_args.learning_rate")
    box = knobs.bounding_box()
    page.mouse.move(box["x"] + target["x"], box["y"] + target["y"])
    tip = panel.locator("[data-testid=rf-knob-tip]")
    _wait(lambda: tip.is_visible() and (tip.text_content() or "").startswith("3 · "), 10, "the knob view's hover", page)
    page.screenshot(path=str(SHOTS / "compare_knobs_hover.png"))
    page.mouse.click(box["x"] + target["x"], box["y"] + target["y"])
    _wait(lambda: [s["focused"] for s in page.evaluate(INSPECT, TRAIN)["series"]] == [False, False, True, False], 10,
          "run 3 focused in the charts", page)
    assert "rf-pinned" in (panel.locator('tr[data-run-id="3"]').get_attribute("class") or "")
    page.mouse.move(5, 5)
    page.screenshot(path=str(SHOTS / "compare_knobs_pinned.png"))
    page.mouse.click(box["x"] + target["x"], box["y"] + target["y"])   # a second click unpins
    page.mouse.move(5, 5)   # and the pointer leaves: nothing hovered either
    _wait(lambda: not any(s["focused"] for s in page.evaluate(INSPECT, TRAIN)["series"]), 10, "run 3 unpinned", page)
    assert "tok/s" in (panel.locator("[data-testid=rf-time-res]").first.text_content() or "")


# Each generation cell's text as set (textContent: the tiny model's answers hold control characters
# that innerText would rewrite), by prompt row and run column.
GEN_CELLS = """(el) => [...el.querySelectorAll('tbody tr')].map((tr) =>
  Object.fromEntries([...tr.querySelectorAll('td[data-run-id]')].map((td) => [td.dataset.runId, td.textContent])))"""


# What a cell shows for an answer, as src/generations.ts's visibleText and emptyAnswer decide:
# an answer that is empty or only whitespace (JavaScript's trim) gets a marker, control
# characters other than line breaks and tabs become U+FFFD.
JS_SPACE = " \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _shown(text: str) -> str:
    if not text.strip(JS_SPACE):
        return "(empty answer)"
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", "\ufffd", text.replace("\r\n", "\n"))


def test_generations_side_by_side(compare):
    page, panel, lab = compare
    gens = [e for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "generation"]
    runs = sorted({e["run_id"] for e in gens})
    assert runs == [1, 2, 3, 4] and all(e["prompts"] == PROMPTS for e in gens), gens
    xs = sorted({e["samples_seen"] for e in gens})
    assert len(xs) == 3, xs   # one point per chunk

    def texts_at(x):
        # each run's answers logged last at or before x, by prompt
        out = {}
        for e in gens:
            if e["samples_seen"] <= x:
                out[str(e["run_id"])] = e["texts"]
        return [{rid: _shown(t[i]) for rid, t in out.items()} for i in range(len(PROMPTS))]

    view = panel.locator("[data-testid=rf-generations]")
    table = view.locator("[data-testid=rf-generations-table]")
    label = view.locator("[data-testid=rf-generations-label]")
    slider = view.locator("[data-testid=rf-generations-slider]")
    view.scroll_into_view_if_needed()
    # a row per prompt, a column per run, each cell the run's last answer: the newest point
    newest = texts_at(xs[-1])
    _wait(lambda: view.is_visible() and table.count() == 1 and table.evaluate(GEN_CELLS) == newest, 60,
          "the generations table at the newest point", page)
    prompts = [table.locator(f'tbody tr[data-prompt-index="{i}"] td.rf-gen-prompt').text_content() for i in range(2)]
    assert prompts == PROMPTS
    # the columns go by the names the charts use
    names = [s["name"] for s in page.evaluate(INSPECT, TRAIN)["series"]]
    heads = table.locator("thead th[data-run-id]")
    assert heads.count() == 4
    assert [heads.nth(i).text_content().endswith(names[i]) for i in range(4)] == [True] * 4, (names, heads.all_text_contents())
    # the names sit at the top of their headers, so a column whose run is not behind (no "from N
    # samples" line) never has its name level with the other columns' "from" lines
    assert {heads.nth(i).evaluate("(el) => getComputedStyle(el).verticalAlign") for i in range(4)} == {"top"}
    # the prompts have no references: no legend for the reference marks
    assert view.locator("[data-testid=rf-generations-legend]").is_hidden()
    before = label.text_content()
    assert before.startswith(f"after {xs[-1]} samples (chunk 3/3)") and before.endswith("newest"), before
    assert slider.get_attribute("max") == "2" and slider.input_value() == "2"
    view.screenshot(path=str(SHOTS / "compare_generations.png"))
    # the slider to its first position (as a keyboard user would): the first chunk's answers
    slider.focus()
    slider.press("Home")
    first = texts_at(xs[0])
    _wait(lambda: label.text_content() != before and table.evaluate(GEN_CELLS) == first, 10,
          "the first chunk's answers", page)
    assert label.text_content() == f"after {xs[0]} samples (chunk 1/3)"
    assert slider.input_value() == "0"
    view.screenshot(path=str(SHOTS / "compare_generations_first.png"))
    # back to the end: it follows the newest point again
    slider.press("End")
    _wait(lambda: (label.text_content() or "").endswith("newest") and table.evaluate(GEN_CELLS) == newest, 10,
          "the newest answers again", page)
    # the arrow keys step one point (JupyterLab's notebook shortcuts would otherwise take them)
    slider.press("ArrowLeft")
    middle = texts_at(xs[1])
    _wait(lambda: label.text_content() == f"after {xs[1]} samples (chunk 2/3)" and table.evaluate(GEN_CELLS) == middle, 10,
          "one point back after ArrowLeft", page)
    assert slider.input_value() == "1"
    slider.press("ArrowRight")
    _wait(lambda: (label.text_content() or "").endswith("newest") and table.evaluate(GEN_CELLS) == newest, 10,
          "the newest answers after ArrowRight", page)
    assert slider.input_value() == "2"
    # generating has its own slice of the engine time split
    _wait(lambda: "generate" in (panel.locator(".rf-time-legend").first.text_content() or ""), 30,
          "the generate slice in the time split", page)


def test_report_has_the_new_sections(compare, browser, tmp_path):
    _, _, lab = compare
    out = tmp_path / "compare.html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(lab.root / "experiments" / EXPERIMENT),
                           "-o", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1, offline=True)
    page = context.new_page()
    try:
        page.goto(out.as_uri())
        page.wait_for_function("['knobs-scatter', 'resources'].every((id) => "
                               "document.querySelector(`#${id} .main-svg`))", timeout=60_000)
        heads = page.locator("h2").all_text_contents()
        assert "Knobs → metric" in heads and "Resources" in heads
        # one scatter per knob that varies, a point per run, drawn
        knobs = page.evaluate("""() => { const d = document.getElementById('knobs-scatter');
            return {names: d.data.map((t) => t.name), points: d.data.map((t) => t.y.length),
                    drawn: d.querySelectorAll('.scatterlayer .trace .point').length}; }""")
        assert knobs["names"] == ["r", "learning_rate"] and knobs["points"] == [4, 4] and knobs["drawn"] == 8, knobs
        resources = page.evaluate("() => document.getElementById('resources').data.map((t) => [t.name, t.y.length])")
        assert len(resources) == 8 and all(n == 3 for _, n in resources), resources   # 4 runs x (memory, tokens/s), 3 chunks
        page.locator("#knobs-scatter").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "compare_report_knobs.png"))
        # the leaderboard never breaks inside a value: every cell is one line, its text whole in its title
        lines = page.evaluate("""() => {
            const head = [...document.querySelectorAll('h2')].find((e) => e.textContent === 'Leaderboard');
            return [...head.nextElementSibling.querySelectorAll('td')].map((td) => {
            const r = document.createRange(); r.selectNodeContents(td);
            return [new Set([...r.getClientRects()].map((b) => Math.round(b.top))).size, td.title, td.textContent.trim()]; }); }""")
        assert lines and all(n <= 1 for n, _, _ in lines), [x for x in lines if x[0] > 1]
        assert all(t == txt for _, t, txt in lines if txt), [x for x in lines if x[1] != x[2]]
        page.locator("h2", has_text="Leaderboard").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "compare_after_leaderboard.png"))
        page.locator("#resources").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "compare_report_resources.png"))
    finally:
        context.close()
