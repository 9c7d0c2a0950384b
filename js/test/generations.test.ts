// Live generations side by side: the fold of `generation` events (src/state.ts), the model of
// the view (src/generations.ts: the points, each run's generation at a point, the reference
// marks) and the view itself in a DOM (src/generationsview.ts: the slider, following the newest
// point, runs without generations, escaping).
// @vitest-environment happy-dom
import { describe, expect, it, vi } from "vitest";
import { emptyAnswer, exactMatch, genAt, genModel, genPoints, pointLabel, visibleText, wordDiff } from "../src/generations";
import { createGenerationsView, EMPTY, genCell, NONE } from "../src/generationsview";
import { timeSplitFigure } from "../src/chartplan";
import { createTimeSplitView } from "../src/timesplit";
import { createState, ingest, type PanelState, type WireEvent } from "../src/state";

const PROMPTS = ["What color is the cat?", "What color is the dog?"];
const REFS = ["black", null];

let seq = 0;
function ev(e: Omit<WireEvent, "seq">): WireEvent {
  return { ...e, seq: ++seq } as WireEvent;
}

function gen(runId: number, chunk: number, samples: number, texts: unknown[], extra: Record<string, unknown> = {}): WireEvent {
  return ev({ type: "generation", run_id: runId, epoch: 0, chunk, step: (chunk + 1) * 2, samples_seen: samples,
    prompts: PROMPTS, references: REFS, texts, max_new_tokens: 16, gen_s: 0.25, ...extra });
}

/** Two runs of three chunks (16 samples each), run 2 one chunk behind; run 3 never generates. */
function experiment(): PanelState {
  seq = 0;
  const state = createState();
  ingest(state, [
    ev({ type: "run_created", run_id: 1, knobs: { "training_args.learning_rate": 1e-3 }, num_chunks: 3 }),
    ev({ type: "run_created", run_id: 2, knobs: { "training_args.learning_rate": 1e-4 }, num_chunks: 3 }),
    ev({ type: "run_created", run_id: 3, knobs: { "training_args.learning_rate": 1e-5 }, num_chunks: 3 }),
    gen(1, 0, 16, ["a cat", "a dog"]),
    gen(2, 0, 16, ["blue", "grey"]),
    gen(1, 1, 32, ["The cat is black.", "brown"]),
    gen(2, 1, 32, ["black", "brown dog"]),
    gen(1, 2, 48, ["  black\n", "brown"]),
  ]);
  return state;
}

function shownRuns(state: PanelState) {
  return [...state.runs.values()];
}

describe("the fold of generation events", () => {
  it("keeps each run's generations in log order and the latest prompts", () => {
    const state = experiment();
    expect(state.generationCount).toBe(5);
    expect(state.runs.get(1)!.generations.map((g) => [g.chunk, g.step, g.samples_seen, g.texts])).toEqual([
      [0, 2, 16, ["a cat", "a dog"]], [1, 4, 32, ["The cat is black.", "brown"]], [2, 6, 48, ["  black\n", "brown"]]]);
    expect(state.runs.get(3)!.generations).toEqual([]);
    expect(state.samplePrompts).toEqual({ prompts: PROMPTS, references: ["black", null] });
  });

  it("skips what is malformed and never throws", () => {
    const state = createState();
    seq = 0;
    const base = { epoch: 0, chunk: 0, step: 1, samples_seen: 8, prompts: ["p", "q"], references: ["a", null] };
    const r = ingest(state, [
      ev({ type: "run_created", run_id: 1, knobs: {} }),
      ev({ type: "generation", ...base, run_id: "1", texts: ["x", "y"] }),           // no run id
      ev({ type: "generation", ...base, run_id: 7, texts: ["x", "y"] }),             // an unknown run: none invented
      ev({ type: "generation", ...base, run_id: 1, texts: "x y" }),                  // texts not a list
      ev({ type: "generation", ...base, run_id: 1, texts: ["x", 3] }),               // a text not a string
      ev({ type: "generation", ...base, run_id: 1, texts: ["x"] }),                  // not one text per prompt
      ev({ type: "generation", ...base, run_id: 1, texts: ["x", "y"], prompts: ["p", null] }),
    ]);
    expect(r.applied).toBe(7);
    expect([...state.runs.keys()]).toEqual([1]);
    expect(state.runs.get(1)!.generations).toEqual([]);
    expect(state.samplePrompts).toBeNull();
    expect(state.generationCount).toBe(0);
    // odd fields of an event that answers its prompts: null, and references that do not line up: none
    ingest(state, [ev({ type: "generation", run_id: 1, samples_seen: "8", chunk: 1.5, texts: ["x", "y"], prompts: ["p", "q"],
      references: ["a"] })]);
    expect(state.runs.get(1)!.generations).toEqual([{ epoch: null, chunk: null, step: null, samples_seen: null,
      texts: ["x", "y"], prompts: ["p", "q"], references: [null, null] }]);
    expect(state.samplePrompts).toEqual({ prompts: ["p", "q"], references: [null, null] });
    // a generation without samples_seen has no place on the slider
    expect(genPoints(state)).toEqual([]);
  });

  it("adds chunk_done's gen_s to the time split as its own slice (absent: nothing)", () => {
    seq = 0;
    const state = createState();
    ingest(state, [
      ev({ type: "chunk_done", run_id: 1, train_s: 2, eval_s: 1, gen_s: 0.5, swap_s: 0.25, other_s: 0.25 }),
      ev({ type: "chunk_done", run_id: 1, train_s: 2, eval_s: 1, swap_s: 0.25, other_s: 0.25 }),
      ev({ type: "chunk_done", run_id: 2, train_s: 1, gen_s: "2" }),
    ]);
    expect(state.runs.get(1)!.time).toEqual({ train: 4, eval: 2, generate: 0.5, swap: 0.5, other: 0.5 });
    expect(state.time.generate).toBe(0.5);
    const fig = timeSplitFigure(state);
    expect(fig.categories).toEqual(["train", "eval", "generate", "swap", "other"]);
    expect(fig.values.generate).toEqual([0.5, 0.5, 0]);
    expect(fig.total).toBeCloseTo(8.5);
    // generating was asked for: it is not overhead
    expect(fig.overhead).toBeCloseTo(1 / 8.5);
  });
});

describe("the time split view", () => {
  function drawn(events: Omit<WireEvent, "seq">[]) {
    seq = 0;
    const state = createState();
    ingest(state, events.map(ev));
    const view = createTimeSplitView({ requestDraw: () => {}, noteCall: () => {} });
    view.render(state);
    const legend = [...view.details.querySelectorAll(".rf-time-legend > span")].map((s) => s.textContent);
    return { summary: view.details.querySelector("summary")!.textContent, legend, view };
  }

  it("names the generate slice, in its own colour, where some time went to it", () => {
    const { summary, legend, view } = drawn([{ type: "chunk_done", run_id: 1, train_s: 6, eval_s: 2, gen_s: 1, swap_s: 0.5, other_s: 0.5 }]);
    expect(summary).toBe("engine time 10.0 s: train 60.0% · eval 20.0% · generate 10.0% · swap 5.0% · other 5.0% (overhead 10.0%)");
    expect(legend).toEqual(["train", "eval", "generate", "swap", "other"]);
    const segs = [...view.details.querySelectorAll(".rf-time-row")][1].querySelectorAll(".rf-time-fill > span");
    expect([...segs].map((s) => (s as HTMLElement).title)).toContain("run 1 generate: 1.00 s");
  });

  it("leaves it out of an experiment that never generated", () => {
    const { summary, legend } = drawn([{ type: "chunk_done", run_id: 1, train_s: 6, eval_s: 2, swap_s: 1, other_s: 1 }]);
    expect(summary).toBe("engine time 10.0 s: train 60.0% · eval 20.0% · swap 10.0% · other 10.0% (overhead 20.0%)");
    expect(legend).toEqual(["train", "eval", "swap", "other"]);
  });
});

describe("generations at a point in training", () => {
  it("takes the distinct samples-seen points, sorted, labelled with their chunk", () => {
    const state = experiment();
    const points = genPoints(state);
    expect(points.map((p) => p.x)).toEqual([16, 32, 48]);
    expect(pointLabel(points[1], false)).toBe("after 32 samples (chunk 2/3)");
    expect(pointLabel({ x: 96, epoch: 1, chunk: 0, numChunks: 3 }, true)).toBe("after 96 samples (epoch 2, chunk 1/3)");
    expect(pointLabel({ x: 1, epoch: null, chunk: null, numChunks: null }, false)).toBe("after 1 sample");
    // a warm clone's x counts its parent's samples but its epochs are its own: the label says whose
    expect(pointLabel({ x: 39168, epoch: 26, chunk: 0, numChunks: 4, cloneOf: { run: 5 } }, true))
      .toBe("after 39168 samples (run 5's epoch 27, chunk 1/4)");
  });

  it("shows each run's latest generation at or before the point", () => {
    const state = experiment();
    const run2 = state.runs.get(2)!;
    expect(genAt(run2, 15)).toBeNull();
    expect(genAt(run2, 16)!.texts).toEqual(["blue", "grey"]);
    expect(genAt(run2, 40)!.texts).toEqual(["black", "brown dog"]);
    // a chunk generated twice (a resumed run) shows the one logged last
    ingest(state, [gen(2, 1, 32, ["again", "again"])]);
    expect(genAt(run2, 48)!.texts).toEqual(["again", "again"]);
  });

  it("builds a column per shown run that has generated, the others listed as waiting", () => {
    const state = experiment();
    const newest = genModel(state, shownRuns(state), null);
    expect(newest.index).toBe(2);
    expect(newest.label).toBe("after 48 samples (chunk 3/3)");
    expect(newest.columns.map((c) => [c.runId, c.name, c.gen?.samples_seen])).toEqual([
      [1, "1 · lr 1e-3", 48], [2, "2 · lr 1e-4", 32]]);
    expect(newest.waiting).toEqual([3]);
    expect(newest.prompts).toEqual(PROMPTS);
    const first = genModel(state, shownRuns(state), 16);
    expect(first.index).toBe(0);
    expect(first.columns.map((c) => c.gen!.texts[0])).toEqual(["a cat", "blue"]);
    // between two points: the one before; before the first: the first
    expect(genModel(state, shownRuns(state), 40).index).toBe(1);
    expect(genModel(state, shownRuns(state), 3).index).toBe(0);
    // only the runs shown get a column
    expect(genModel(state, [state.runs.get(2)!], null).columns.map((c) => c.runId)).toEqual([2]);
    expect(genModel(createState(), [], null)).toMatchObject({ index: -1, label: "", columns: [], prompts: [] });
  });

  it("marks an exact match (whitespace aside) and the words the reference lacks", () => {
    expect(exactMatch("  black\n", "black")).toBe(true);
    expect(exactMatch("Black", "black")).toBe(false);
    const parts = wordDiff("The cat is black.", "black");
    expect(parts.map((p) => p.text).join("")).toBe("The cat is black.");
    expect(parts.filter((p) => p.extra).map((p) => p.text)).toEqual(["The", "cat", "is"]);
    // case and punctuation at a word's ends do not count; whitespace and bare punctuation never differ
    expect(wordDiff("BLACK, - it is", "it is black").filter((p) => p.extra)).toEqual([]);
  });

  it("counts unreadable characters as differing, never as bare punctuation", () => {
    // nothing but a control byte and replacement marks: not a match, and underlined whole
    expect(exactMatch("\u0002\ufffd\ufffd", "orange")).toBe(false);
    expect(wordDiff("\u0002\ufffd\ufffd", "orange")).toEqual([{ text: "\u0002\ufffd\ufffd", extra: true }]);
    expect(wordDiff(visibleText("\u0002\ufffd\ufffd"), "orange")).toEqual([{ text: "\ufffd\ufffd\ufffd", extra: true }]);
    // a known word with a replacement mark stuck to it is not that word
    expect(wordDiff("orange\ufffd is", "orange is").filter((p) => p.extra).map((p) => p.text)).toEqual(["orange\ufffd"]);
    // unless the reference has that very token
    expect(wordDiff("a \ufffd b", "a \ufffd b").filter((p) => p.extra)).toEqual([]);
  });

  it("shows control characters as U+FFFD, keeping line breaks and tabs", () => {
    expect(visibleText("a\u0002b\u0000\u007f\u009b c")).toBe("a\ufffdb\ufffd\ufffd\ufffd c");
    expect(visibleText("line\n\tindented\r\nnext\rx")).toBe("line\n\tindented\nnext\ufffdx");
    expect(visibleText("plain ünïcode 猫 ✓")).toBe("plain ünïcode 猫 ✓");
  });

  it("tells an empty answer (nothing, or only whitespace) from one of unreadable bytes", () => {
    expect(emptyAnswer("")).toBe(true);
    expect(emptyAnswer(" \n\t ")).toBe(true);
    expect(emptyAnswer("\u0002")).toBe(false);
    expect(emptyAnswer(" x ")).toBe(false);
  });
});

describe("the generations view", () => {
  function setup() {
    const state = experiment();
    const onHover = vi.fn();
    const onPick = vi.fn();
    const view = createGenerationsView({ onHover, onPick });
    document.body.append(view.details);
    const slider = view.details.querySelector<HTMLInputElement>("[data-testid=rf-generations-slider]")!;
    const label = () => view.details.querySelector("[data-testid=rf-generations-label]")!.textContent;
    const cells = (i: number) => [...view.details.querySelectorAll(`tr[data-prompt-index="${i}"] td[data-run-id]`)].map((td) => td.textContent);
    const move = (i: number) => {
      slider.value = String(i);
      slider.dispatchEvent(new Event("input"));
    };
    return { state, view, slider, label, cells, move, onHover, onPick };
  }

  it("is hidden until some run has generated", () => {
    const view = createGenerationsView({ onHover: () => {}, onPick: () => {} });
    const state = createState();
    view.update(state, [], new Set());
    expect(view.details.style.display).toBe("none");
    ingest(state, [{ seq: 1, type: "run_created", run_id: 1, knobs: {} }]);
    view.update(state, shownRuns(state), new Set());
    expect(view.details.style.display).toBe("none");
  });

  it("shows a row per prompt and a column per run, at the newest point", () => {
    const { state, view, slider, label, cells } = setup();
    view.update(state, shownRuns(state), new Set());
    expect(view.details.style.display).toBe("");
    expect(view.details.getAttribute("data-testid")).toBe("rf-generations");
    expect([...view.details.querySelectorAll("thead th[data-run-id]")].map((th) => th.getAttribute("data-run-id"))).toEqual(["1", "2"]);
    expect(view.details.querySelectorAll("tbody tr").length).toBe(2);
    expect(slider.max).toBe("2");
    expect(slider.value).toBe("2");
    expect(label()).toBe("after 48 samples (chunk 3/3) · newest");
    expect(cells(0)).toEqual(["✓   black\n", "✓ black"]);
    expect(cells(1)).toEqual(["brown", "brown dog"]);
    // run 2 is a chunk behind: its header says where its texts are from
    expect(view.details.querySelector('thead th[data-run-id="2"] .rf-gen-from')!.textContent).toBe("from 32 samples");
    expect(view.details.querySelector('thead th[data-run-id="1"] .rf-gen-from')).toBeNull();
    expect(view.details.querySelector("[data-testid=rf-generations-note]")!.textContent).toBe("no generations yet: run 3");
    // the prompt column has the reference where there is one
    const firsts = [...view.details.querySelectorAll("tbody td.rf-gen-prompt")].map((td) => td.textContent);
    expect(firsts).toEqual(["What color is the cat?reference: black", "What color is the dog?"]);
  });

  it("moves with the slider, and stays where it was put as new chunks arrive", () => {
    const { state, view, slider, label, cells, move } = setup();
    view.update(state, shownRuns(state), new Set());
    move(0);
    expect(label()).toBe("after 16 samples (chunk 1/3)");
    expect(cells(0)).toEqual(["a cat", "blue"]);
    expect(cells(1)).toEqual(["a dog", "grey"]);
    // run 2's third chunk, then run 1's second epoch: the slider stays on the first point
    ingest(state, [gen(2, 2, 48, ["black", "brown"]), gen(1, 0, 64, ["black", "tan"], { epoch: 1 })]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.max).toBe("3");
    expect(slider.value).toBe("0");
    expect(cells(0)).toEqual(["a cat", "blue"]);
    // back to the end: it follows the newest point again
    move(3);
    expect(label()).toBe("after 64 samples (epoch 2, chunk 1/3) · newest");
    expect(cells(1)).toEqual(["tan", "brown"]);
    ingest(state, [gen(1, 1, 80, ["black", "white"], { epoch: 1 })]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.value).toBe("4");
    expect(label()).toBe("after 80 samples (epoch 2, chunk 2/3) · newest");
    expect(cells(1)).toEqual(["white", "brown"]);
  });

  it("follows the newest point by default as chunks end", () => {
    const { state, view, slider, label } = setup();
    view.update(state, shownRuns(state), new Set());
    ingest(state, [gen(2, 2, 48, ["x", "y"])]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.value).toBe("2");
    expect(view.details.querySelector('thead th[data-run-id="2"] .rf-gen-from')).toBeNull();
    ingest(state, [gen(1, 0, 64, ["x", "y"], { epoch: 1 })]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.value).toBe("3");
    expect(label()).toBe("after 64 samples (epoch 2, chunk 1/3) · newest");
  });

  it("shows a dash for a run with nothing yet at that point", () => {
    const { state, view, cells, move } = setup();
    ingest(state, [ev({ type: "run_created", run_id: 4, knobs: { "training_args.learning_rate": 1e-6 }, num_chunks: 3 }),
      gen(4, 1, 32, ["late", "later"])]);
    view.update(state, shownRuns(state), new Set());
    move(0);
    expect(cells(0)).toEqual(["a cat", "blue", NONE]);
    expect(view.details.querySelector('tr[data-prompt-index="1"] td[data-run-id="4"]')!.classList.contains("rf-gen-none")).toBe(true);
    move(1);
    expect(cells(0)).toEqual(["The cat is black.", "✓ black", "late"]);
  });

  it("matches texts by prompt when a resumed experiment asks other prompts", () => {
    const { state, view, cells, move } = setup();
    const other = ["What color is the dog?", "What color is the bird?"];
    ingest(state, [gen(2, 2, 48, ["dark", "red"], { prompts: other, references: [null, "red"] })]);
    // the rows are the latest prompts; run 1's answers from before line up by prompt
    expect(state.samplePrompts).toEqual({ prompts: other, references: [null, "red"] });
    view.update(state, shownRuns(state), new Set());
    expect(cells(0)).toEqual(["brown", "dark"]);
    expect(cells(1)).toEqual([NONE, "✓ red"]);
    move(0);
    expect(cells(0)).toEqual(["a dog", "grey"]);
  });

  it("marks the cell that matches the reference, and underlines words it lacks", () => {
    const { state, view, move } = setup();
    view.update(state, shownRuns(state), new Set());
    move(1);
    const cell = (id: number) => view.details.querySelector(`tr[data-prompt-index="0"] td[data-run-id="${id}"]`)!;
    expect(cell(2).querySelector("[data-testid=rf-gen-exact]")).not.toBeNull();
    expect(cell(1).querySelector("[data-testid=rf-gen-exact]")).toBeNull();
    expect([...cell(1).querySelectorAll(".rf-gen-extra")].map((s) => s.textContent)).toEqual(["The", "cat", "is"]);
    // no reference for the second prompt: the text as it is, unmarked
    const noRef = view.details.querySelector('tr[data-prompt-index="1"] td[data-run-id="1"]')!;
    expect(noRef.querySelectorAll(".rf-gen-extra, [data-testid=rf-gen-exact]").length).toBe(0);
  });

  it("sets prompts, references and texts as text, never as markup", () => {
    seq = 0;
    const state = createState();
    const evil = '<img src=x onerror="window.pwned=1"><b>bold</b>';
    ingest(state, [ev({ type: "run_created", run_id: 1, knobs: {} }),
      ev({ type: "generation", run_id: 1, epoch: 0, chunk: 0, step: 1, samples_seen: 8, prompts: [evil, "p2"],
        references: ["<i>ref</i>", null], texts: [evil, "<script>x</script>"] })]);
    const view = createGenerationsView({ onHover: () => {}, onPick: () => {} });
    view.update(state, shownRuns(state), new Set());
    expect(view.details.querySelector("img, b, i, script")).toBeNull();
    const rows = view.details.querySelectorAll("tbody tr");
    expect(rows[0].querySelector("td.rf-gen-prompt .rf-gen-text")!.textContent).toBe(evil);
    expect(rows[0].querySelector("td.rf-gen-prompt .rf-gen-ref")!.textContent).toBe("reference: <i>ref</i>");
    expect(rows[0].querySelector("td[data-run-id]")!.textContent).toBe(evil);
    expect(rows[1].querySelector("td[data-run-id]")!.textContent).toBe("<script>x</script>");
  });

  it("shows an empty answer as a muted marker that says why, with or without a reference", () => {
    for (const ref of [null, "black"]) {
      for (const text of ["", "  \n "]) {
        const cell = genCell(text, ref);
        expect(cell.textContent).toBe(EMPTY);
        expect(cell.classList.contains("rf-gen-empty")).toBe(true);
        expect(cell.title).toMatch(/generated no text/);
        expect(cell.querySelectorAll(".rf-gen-extra, [data-testid=rf-gen-exact]").length).toBe(0);
      }
    }
    // in the table: a distinct class from a missing answer's dash
    const { state, view } = setup();
    ingest(state, [gen(2, 2, 48, ["", "\u0002\ufffd\ufffd"])]);
    view.update(state, shownRuns(state), new Set());
    const td = (p: number, id: number) => view.details.querySelector(`tr[data-prompt-index="${p}"] td[data-run-id="${id}"]`)!;
    expect(td(0, 2).textContent).toBe(EMPTY);
    expect(td(0, 2).querySelector(".rf-gen-empty")).not.toBeNull();
    expect(td(0, 2).classList.contains("rf-gen-none")).toBe(false);
    // bytes that are not text show as replacement marks, not as an empty cell
    expect(td(1, 2).textContent).toBe("\ufffd\ufffd\ufffd");
    expect(td(1, 2).querySelector(".rf-gen-empty")).toBeNull();
  });

  it("underlines a cell of unreadable characters against the reference", () => {
    const cell = genCell("\u0002\ufffd\ufffd", "orange");
    expect(cell.textContent).toBe("\ufffd\ufffd\ufffd");
    expect(cell.querySelector("[data-testid=rf-gen-exact]")).toBeNull();
    expect([...cell.querySelectorAll(".rf-gen-extra")].map((s) => s.textContent)).toEqual(["\ufffd\ufffd\ufffd"]);
    // garbage glued to a word: the word is not the reference's, and the byte shows as a mark
    const glued = genCell("zebra\u0002Z# orange", "orange");
    expect([...glued.querySelectorAll(".rf-gen-extra")].map((s) => s.textContent)).toEqual(["zebra\ufffdZ#"]);
  });

  it("explains the marks in a legend under the table when some prompt has a reference", () => {
    const { state, view } = setup();
    view.update(state, shownRuns(state), new Set());
    const legend = view.details.querySelector<HTMLElement>("[data-testid=rf-generations-legend]")!;
    expect(legend.style.display).toBe("");
    expect(legend.textContent).toBe("✓ the answer equals the reference · underlined: words the reference does not have");
    expect(legend.querySelector(".rf-gen-extra")!.textContent).toBe("underlined");
    // it comes after the table
    const wrap = view.details.querySelector(".rf-gen-wrap")!;
    expect(wrap.compareDocumentPosition(legend) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    // prompts without references: no legend
    ingest(state, [gen(2, 2, 48, ["x", "y"], { references: [null, null] })]);
    view.update(state, shownRuns(state), new Set());
    expect(legend.style.display).toBe("none");
  });

  it("steps the slider with the arrow keys itself, keeping them from the notebook", () => {
    const { state, view, slider, label, cells } = setup();
    view.update(state, shownRuns(state), new Set());
    const outside = vi.fn();
    document.body.addEventListener("keydown", outside);
    const press = (key: string, extra: KeyboardEventInit = {}) => {
      const e = new KeyboardEvent("keydown", { key, bubbles: true, cancelable: true, ...extra });
      slider.dispatchEvent(e);
      return e;
    };
    // one point back from the newest: live-follow ends
    const e = press("ArrowLeft");
    expect(e.defaultPrevented).toBe(true);
    expect(outside).not.toHaveBeenCalled();
    expect(slider.value).toBe("1");
    expect(label()).toBe("after 32 samples (chunk 2/3)");
    expect(cells(0)).toEqual(["The cat is black.", "✓ black"]);
    press("ArrowDown");
    expect(slider.value).toBe("0");
    expect(label()).toBe("after 16 samples (chunk 1/3)");
    // at the first point: stays there
    press("ArrowLeft");
    expect(slider.value).toBe("0");
    // a new chunk does not move it
    ingest(state, [gen(2, 2, 48, ["x", "y"])]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.value).toBe("0");
    press("ArrowRight");
    expect(label()).toBe("after 32 samples (chunk 2/3)");
    // forward to the last point: it follows the newest again
    press("ArrowUp");
    expect(slider.value).toBe("2");
    expect(label()).toBe("after 48 samples (chunk 3/3) · newest");
    ingest(state, [gen(1, 0, 64, ["x", "y"], { epoch: 1 })]);
    view.update(state, shownRuns(state), new Set());
    expect(slider.value).toBe("3");
    expect(label()).toBe("after 64 samples (epoch 2, chunk 1/3) · newest");
    // other keys, and arrows with a modifier, are left alone
    for (const [key, extra] of [["Home", {}], ["a", {}], ["ArrowLeft", { ctrlKey: true }]] as const) {
      expect(press(key, extra).defaultPrevented).toBe(false);
    }
    expect(outside).toHaveBeenCalledTimes(3);
    expect(slider.value).toBe("3");
    document.body.removeEventListener("keydown", outside);
  });

  it("says under each header where a run behind the point has its answers from, as runs report one after another", () => {
    // four runs at the first point, then each reaching the second one by one while following the
    // newest: a column gets "from" exactly while its run is behind, and shows its own latest answers
    seq = 0;
    const state = createState();
    const view = createGenerationsView({ onHover: () => {}, onPick: () => {} });
    document.body.append(view.details);
    const froms = () => [1, 2, 3, 4].map((id) =>
      view.details.querySelector(`thead th[data-run-id="${id}"] .rf-gen-from`)?.textContent ?? null);
    const cell = (id: number) => view.details.querySelector(`tr[data-prompt-index="0"] td[data-run-id="${id}"]`)!.textContent;
    const label = () => view.details.querySelector("[data-testid=rf-generations-label]")!.textContent;
    const feed = (events: WireEvent[]) => {
      ingest(state, events);
      view.update(state, shownRuns(state), new Set());
    };
    feed([1, 2, 3, 4].map((id) => ev({ type: "run_created", run_id: id, knobs: {}, num_chunks: 3 })));
    for (const id of [1, 2, 3, 4]) feed([gen(id, 0, 32, [`r${id} at 32`, "-"])]);
    expect(froms()).toEqual([null, null, null, null]);
    const order = [4, 1, 2, 3];
    for (const [k, id] of order.entries()) {
      feed([gen(id, 1, 64, [`r${id} at 64`, "-"])]);
      expect(label()).toBe("after 64 samples (chunk 2/3) · newest");
      const arrived = order.slice(0, k + 1);
      expect(froms()).toEqual([1, 2, 3, 4].map((r) => (arrived.includes(r) ? null : "from 32 samples")));
      expect([1, 2, 3, 4].map(cell)).toEqual([1, 2, 3, 4].map((r) => `r${r} at ${arrived.includes(r) ? 64 : 32}`));
    }
  });

  it("hovers and pins a run from its column header", () => {
    const { state, view, onHover, onPick } = setup();
    view.update(state, shownRuns(state), new Set([2]));
    const th = view.details.querySelector<HTMLElement>('thead th[data-run-id="2"]')!;
    expect(th.classList.contains("rf-gen-pinned")).toBe(true);
    th.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    expect(onHover).toHaveBeenLastCalledWith(2);
    th.click();
    expect(onPick).toHaveBeenCalledWith(2);
    view.details.querySelector(".rf-gen-wrap")!.dispatchEvent(new MouseEvent("mouseleave"));
    expect(onHover).toHaveBeenLastCalledWith(null);
  });

  it("draws nothing while folded, and the table once opened", () => {
    const { state, view } = setup();
    view.details.open = false;
    view.update(state, shownRuns(state), new Set());
    expect(view.details.querySelector("table")).toBeNull();
    expect(view.details.querySelector("summary")!.textContent).toBe("generations: 2 prompts, 2 runs, after 48 samples (chunk 3/3)");
    view.details.open = true;
    view.details.dispatchEvent(new Event("toggle"));
    expect(view.details.querySelectorAll("tbody tr").length).toBe(2);
  });
});
