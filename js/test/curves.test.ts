// Curve tools: TensorBoard's smoothing, log-scale ticks, the x axis choice, the multi-run hover
// rows, run short names and the remembered curve settings.
import { describe, expect, it } from "vitest";
import { hoverRows, logValues, nearestIndex, seriesSmoothing, smoothed, SMOOTH_MIN_POINTS, type DrawSeries } from "../src/canvaschart";
import { logTicks, niceTicks } from "../src/ticks";
import { axisSeries, chunkSpans, createChartBook, planChart, spreadTimes } from "../src/chartplan";
import { compactValueText, knobValueText, runName, runTitle } from "../src/names";
import { parsePrefs } from "../src/viewprefs";
import { createState, ingest } from "../src/state";

describe("smoothing", () => {
  it("is TensorBoard's debiased moving average", () => {
    expect(smoothed([1, 2, 3], 0)).toEqual([1, 2, 3]);
    const s = smoothed([2, 4], 0.5) as number[];
    // first point: no pull towards zero; second: (0.5*1 + 0.5*4 ... ) debiased
    expect(s[0]).toBeCloseTo(2, 12);
    expect(s[1]).toBeCloseTo((0.5 * (0.5 * 2) + 0.5 * 4) / (1 - 0.25), 12);
  });
  it("keeps gaps and does not reset at them", () => {
    const s = smoothed([1, null, NaN, 3], 0.6);
    expect(s[1]).toBeNull();
    expect(Number.isNaN(s[2] as number)).toBe(true);
    expect(s[3]).toBeGreaterThan(1);
    expect(s[3]).toBeLessThan(3);
  });
  it("is for dense series only: a few eval points, or the eval chart, stay raw", () => {
    const dense = Array.from({ length: SMOOTH_MIN_POINTS }, (_, i) => i);
    expect(seriesSmoothing(dense, 0.8)).toBe(0.8);
    expect(seriesSmoothing([1.2, 0.9, 0.64], 0.8)).toBe(0);
    expect(seriesSmoothing([...dense.slice(1), null, NaN], 0.8)).toBe(0);   // gaps do not count
    expect(seriesSmoothing(dense, 0.8, false)).toBe(0);
    expect(seriesSmoothing(dense, 0)).toBe(0);
  });
  it("flattens a noisy curve towards its mean", () => {
    const y = Array.from({ length: 400 }, (_, i) => 1 + (i % 2 ? 0.5 : -0.5));
    const s = smoothed(y, 0.9) as number[];
    expect(Math.abs(s[399] - 1)).toBeLessThan(0.1);
  });
});

describe("log y", () => {
  it("drops zero and negatives and ticks at powers of ten", () => {
    expect(logValues([100, 0, -1, null, 0.01])).toEqual([2, null, null, null, -2]);
    const t = logTicks(-3.2, 1.1, 6);
    expect(t.labels).toEqual(["0.001", "0.01", "0.1", "1", "10"]);
    expect(t.at).toEqual([-3, -2, -1, 0, 1]);
    // An eval loss from 0.5 to 12 on a short chart: not "1, 10" alone, but 1-2-5 ticks.
    expect(logTicks(Math.log10(0.5), Math.log10(12), 5).labels).toEqual(["0.5", "1", "2", "5", "10"]);
    expect(logTicks(Math.log10(0.3), Math.log10(40), 4).labels).toEqual(["0.5", "1", "2", "5", "10", "20"]);
    // A few decades: 2 and 5 between the powers.
    expect(logTicks(-0.1, 1.05, 10).labels).toEqual(["1", "2", "5", "10"]);
    // Inside one decade: round values placed at their logarithm.
    const inside = logTicks(Math.log10(0.6), Math.log10(0.9), 4);
    expect(inside.labels).toEqual(["0.6", "0.7", "0.8", "0.9"]);
    expect(inside.at[0]).toBeCloseTo(Math.log10(0.6), 12);
    // 2 and 5 between powers far from one read like the powers beside them.
    expect(logTicks(-4.7, -2.6, 6).labels).toEqual(["2e-5", "5e-5", "1e-4", "2e-4", "5e-4", "0.001", "0.002"]);
    // Many decades thin out.
    expect(logTicks(-20, 20, 5).at.length).toBeLessThanOrEqual(6);
    expect(logTicks(-20, 20, 5).labels[0]).toBe("1e-20");
    expect(niceTicks(0, 1, 4).ticks).toEqual([0, 0.5, 1]);
  });
});

describe("x axes", () => {
  const s = { x: [4, 8, 12], y: [3, 2, 1], step: [1, null, 3], t: [1000.5, 1001, 1000.9] };
  it("samples seen is the series itself", () => {
    expect(axisSeries(s, "samples", null)).toBe(s);
  });
  it("step drops points without one, time counts from the first event and drops a clock going back", () => {
    expect(axisSeries(s, "step", null)).toEqual({ x: [1, 3], y: [3, 1] });
    expect(axisSeries(s, "time", 1000)).toEqual({ x: [0.5, 1], y: [3, 2] });
  });
  it("wall time spreads a chunk's points over the chunk: no staircase", () => {
    // Chunk 1 trained 100..104 and logged its 4 steps at 104.5; chunk 2 trained 110..112, logged at 112.1.
    const chunks = [{ start: 100, end: 104 }, { start: 110, end: 112 }];
    const t = [104.5, 104.5, 104.5, 104.5, 112.1, 112.1];
    expect(spreadTimes(t, chunks)).toEqual([101, 102, 103, 104, 111, 112]);
    // no chunk rows (a log cut before its chunk_done): over the gap since the previous block
    expect(spreadTimes(t, [])).toEqual([104.5, 104.5, 104.5, 104.5, 104.5 + 7.6 / 2, 112.1]);
    const xs = axisSeries({ x: [8, 16, 24, 32, 40, 48], y: [6, 5, 4, 3, 2, 1], step: [1, 2, 3, 4, 5, 6], t }, "time", 100, chunks).x;
    expect(new Set(xs).size).toBe(xs.length);   // one x per point: a curve, not risers
    expect(xs).toEqual([1, 2, 3, 4, 11, 12]);
  });
  it("reads a run's chunk spans from the timeline", () => {
    const state = createState();
    ingest(state, [
      { seq: 1, time: 100, type: "run_created", run_id: 1, knobs: {} },
      { seq: 2, time: 104.5, type: "metric", run_id: 1, split: "train", step: 1, samples_seen: 8, metrics: { loss: 2 } },
      { seq: 3, time: 104.5, type: "metric", run_id: 1, split: "train", step: 2, samples_seen: 16, metrics: { loss: 1 } },
      { seq: 4, time: 104.5, type: "chunk_done", run_id: 1, epoch: 0, chunk: 0, start: 102, end: 104 },
    ]);
    expect(chunkSpans(state, 1)).toEqual([{ start: 102, end: 104 }]);
    const book = createChartBook("train", "loss");
    book.xAxis = "time";
    // seconds since the first chunk started (its points now lie before the time they were logged)
    expect(planChart(state, book).traces[0].x).toEqual([1, 2]);
  });
  it("a chart redraws from scratch on another axis", () => {
    const state = createState();
    ingest(state, [
      { seq: 1, time: 100, type: "run_created", run_id: 1, knobs: { "training_args.learning_rate": 0.001 } },
      { seq: 2, time: 101, type: "metric", run_id: 1, split: "train", step: 1, samples_seen: 8, metrics: { loss: 2 } },
      { seq: 3, time: 103, type: "metric", run_id: 1, split: "train", step: 2, samples_seen: 16, metrics: { loss: 1 } },
    ]);
    const book = createChartBook("train", "loss");
    expect(planChart(state, book).traces[0].x).toEqual([8, 16]);
    book.xAxis = "step";
    const p = planChart(state, book);
    expect(p.reset).toBe(true);
    expect(p.traces[0].x).toEqual([1, 2]);
    book.xAxis = "time";
    // Seconds since the first metric was logged.
    expect(planChart(state, book).traces[0].x).toEqual([0, 2]);
  });
});

describe("multi-run hover", () => {
  const series = (runId: number, x: number[], y: (number | null)[]): DrawSeries => ({
    runId, name: `${runId} · lr ${runId}`, color: "#000", dash: "solid", x, y, shown: true, focused: false,
    opacity: 1, width: 1.5, markers: false,
  });
  it("finds each run's nearest finite point", () => {
    expect(nearestIndex([0, 10, 20], [1, null, 3], 9)).toBe(0);
    expect(nearestIndex([0, 10, 20], [1, null, 3], 16)).toBe(2);
    expect(nearestIndex([], [], 3)).toBe(-1);
    expect(nearestIndex([5], [null], 3)).toBe(-1);
  });
  it("lists every shown run at that x, lowest first for a loss, hidden runs left out", () => {
    const a = series(1, [0, 10], [3, 2]);
    const b = series(2, [0, 10], [1, 0.5]);
    const c = { ...series(3, [0, 10], [0.1, 0.1]), shown: false };
    const rows = hoverRows([a, b, c], [a.y, b.y, c.y], 9);
    expect(rows.map((r) => [r.runId, r.value, r.name])).toEqual([[2, 0.5, "2 · lr 2"], [1, 2, "1 · lr 1"]]);
    expect(hoverRows([a, b], [a.y, b.y], 9, false).map((r) => r.runId)).toEqual([1, 2]);
  });
  it("shows the logged value, the smoothed one beside it, and sorts by the logged one", () => {
    const y = [3, 2.5, 0.642, 2.4, 2.3, 2.2, 2.1, 2, 1.9];
    const x = y.map((_, i) => i);
    const a = series(1, x, y);
    const b = series(2, [0, 10], [1, 1.5]);
    const sm = smoothed(y, 0.8);
    const rows = hoverRows([a, b], [a.y, b.y], 2, true, [sm, null]);
    expect(rows.map((r) => [r.runId, r.value])).toEqual([[1, 0.642], [2, 1]]);
    expect(rows[0].smoothed).toBeCloseTo(sm[2] as number, 12);
    expect(rows[0].smoothed).toBeGreaterThan(1);   // what the hover showed alone before
    expect(rows[1].smoothed).toBeNull();
  });
});

describe("run names", () => {
  it("are the id and the run's knobs, short", () => {
    expect(runName({ id: 3, knobs: { "training_args.learning_rate": 0.001, "peft_config.r": 32 } })).toBe("3 · lr 1e-3 · r 32");
    expect(runName({ id: 1, knobs: {} })).toBe("run 1");
    // two knobs at most, learning rate and rank first; the whole config in the title
    expect(runName({ id: 2, knobs: { a: 1, b: 2, c: 3, d: 4, e: 5, f: 6 } })).toBe("2 · a 1 · b 2");
    const knobs = { "peft_config.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "training_args.weight_decay": 0.01,
      "peft_config.r": 8, "training_args.learning_rate": 0.001 };
    expect(runName({ id: 5, knobs })).toBe("5 · lr 1e-3 · r 8");
    expect(runTitle({ id: 5, knobs })).toBe("5 · modules q_proj+k_proj+v_proj+o_proj · wd 0.01 · r 8 · lr 1e-3");
    expect(compactValueText(["q_proj", "k_proj", "v_proj", "o_proj"])).toBe("q_proj…(4)");
    expect(compactValueText("HuggingFaceTB/SmolLM2-135M")).toBe("SmolLM2-135M");
    expect(compactValueText(1e-3)).toBe("1e-3");
    expect(knobValueText(5e-5)).toBe("5e-5");
    expect(knobValueText(0.05)).toBe("0.05");
    expect(knobValueText(["q_proj", "v_proj"])).toBe("q_proj+v_proj");
    expect(knobValueText("cosine")).toBe("cosine");
    expect(knobValueText(null)).toBe("none");
  });
});

describe("curve settings are remembered", () => {
  it("reads back what was saved and ignores what is malformed", () => {
    expect(parsePrefs(JSON.stringify({ curves: { smoothing: 0.6, logY: true, xAxis: "step" } }))!.curves)
      .toEqual({ smoothing: 0.6, logY: true, xAxis: "step" });
    expect(parsePrefs(JSON.stringify({ curves: { smoothing: 5, logY: "yes", xAxis: "epoch" } }))!.curves)
      .toEqual({ smoothing: 0, logY: false, xAxis: "samples" });
  });
});

describe("resources", () => {
  it("sums tokens over train time per run and keeps the highest peak; old logs show nothing", async () => {
    const { runResources, resourceWords } = await import("../src/timesplit");
    const { resourceText } = await import("../src/timeline");
    const state = createState();
    const chunk = (seq: number, run: number, extra: Record<string, unknown>) => ({
      seq, type: "chunk_done", run_id: run, epoch: 0, chunk: seq, device: "cpu", start: seq, end: seq + 1,
      train_s: 2, eval_s: 0, swap_s: 0, other_s: 0, completed_steps: seq, total_steps: 9, samples_seen: seq, chunks_done: seq, ...extra,
    });
    ingest(state, [chunk(1, 1, { tokens: 1000, tokens_per_s: 500, peak_mem_mb: 800 }), chunk(2, 1, { tokens: 3000, tokens_per_s: 1500, peak_mem_mb: 1200 }),
      chunk(3, 2, {})]);
    const r = runResources(state);
    // on a CPU the figure is the process's, the same for every run: only the all-runs row has it
    expect(resourceWords(r.runs.get(1))).toBe("1.0k tok/s");
    expect(resourceWords(r.all)).toBe("process 1.17 GB · 1.0k tok/s");
    expect(resourceWords(r.runs.get(2))).toBe("");
    expect(resourceText(state.timeline[0])).toBe("process peak 800 MB · 500 tok/s");
    expect(resourceText(state.timeline[2])).toBe("");
  });

  it("shows a run's own peak memory where it is its own (CUDA max allocated)", async () => {
    const { runResources, resourceWords, resourceTitle } = await import("../src/timesplit");
    const { resourceText } = await import("../src/timeline");
    const state = createState();
    const chunk = (seq: number, run: number, extra: Record<string, unknown>) => ({
      seq, type: "chunk_done", run_id: run, epoch: 0, chunk: seq, device: "cuda:0", start: seq, end: seq + 1,
      train_s: 2, eval_s: 0, swap_s: 0, other_s: 0, completed_steps: seq, total_steps: 9, samples_seen: seq, chunks_done: seq, ...extra,
    });
    ingest(state, [chunk(1, 1, { tokens: 1000, peak_mem_mb: 800 }), chunk(2, 2, { tokens: 1000, peak_mem_mb: 300 })]);
    const r = runResources(state);
    expect(resourceWords(r.runs.get(1))).toBe("800 MB · 500 tok/s");
    expect(resourceWords(r.runs.get(2))).toBe("300 MB · 500 tok/s");
    expect(resourceWords(r.all)).toBe("800 MB · 500 tok/s");
    expect(resourceTitle(r.runs.get(1), false)).toContain("CUDA max allocated");
    expect(resourceText(state.timeline[1])).toBe("peak 300 MB");
  });

  it("says on the CPU why no run row has a memory figure", async () => {
    const { runResources, resourceTitle } = await import("../src/timesplit");
    const state = createState();
    ingest(state, [{ seq: 1, type: "chunk_done", run_id: 1, epoch: 0, chunk: 0, device: "cpu", start: 0, end: 1, train_s: 1,
      eval_s: 0, swap_s: 0, other_s: 0, completed_steps: 1, total_steps: 2, samples_seen: 1, chunks_done: 1, tokens: 10, peak_mem_mb: 620 }]);
    const r = runResources(state);
    expect(resourceTitle(r.all, true)).toMatch(/process.*no run's own memory/);
    expect(resourceTitle(r.runs.get(1), false)).toMatch(/no run's own memory is known/);
  });
});

describe("curve notes", () => {
  it("say why wall-time curves rise in steps, and that smoothing leaves the eval chart alone", async () => {
    const { curveNotes } = await import("../src/chartview");
    expect(curveNotes({ smoothing: 0, xAxis: "samples" })).toEqual([]);
    expect(curveNotes({ smoothing: 0, xAxis: "step" })).toEqual([]);
    const wall = curveNotes({ smoothing: 0, xAxis: "time" });
    expect(wall.length).toBe(1);
    expect(wall[0]).toMatch(/take turns on the device/);
    const both = curveNotes({ smoothing: 0.6, xAxis: "time" });
    expect(both[1]).toMatch(/smoothing applies to the train chart.*eval curves/);
  });
});
