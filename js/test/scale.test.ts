// The panel at AutoML scale: run colours, downsampling, sorting, pruned/deleted grouping.
import { describe, expect, it } from "vitest";
import { createState, ingest, type WireEvent } from "../src/state";
import { PALETTE, runColor, runDash } from "../src/palette";
import {
  effectiveSort,
  headerCounts,
  isCollapsible,
  isPruned,
  knobSort,
  runShown,
  sortRuns,
} from "../src/table";
import {
  createChartBook,
  drawnPoints,
  lttb,
  MAX_TRACE_POINTS,
  POINT_BUDGET,
  tracePointLimit,
  planChart,
  planIsEmpty,
} from "../src/chartplan";

/** CIE L*a*b* of an sRGB hex colour (D65), for a perceptual distance between run colours. */
function lab(hex: string): [number, number, number] {
  const n = parseInt(hex.slice(1), 16);
  const c = [(n >> 16) & 255, (n >> 8) & 255, n & 255].map((v) => {
    const u = v / 255;
    return u <= 0.04045 ? u / 12.92 : ((u + 0.055) / 1.055) ** 2.4;
  });
  const X = (c[0] * 0.4124 + c[1] * 0.3576 + c[2] * 0.1805) / 0.95047;
  const Y = c[0] * 0.2126 + c[1] * 0.7152 + c[2] * 0.0722;
  const Z = (c[0] * 0.0193 + c[1] * 0.1192 + c[2] * 0.9505) / 1.08883;
  const f = (t: number) => (t > 0.008856 ? Math.cbrt(t) : 7.787 * t + 16 / 116);
  return [116 * f(Y) - 16, 500 * (f(X) - f(Y)), 200 * (f(Y) - f(Z))];
}
function deltaE(a: string, b: string): number {
  const A = lab(a);
  const B = lab(b);
  return Math.hypot(A[0] - B[0], A[1] - B[1], A[2] - B[2]);
}

let seq = 0;
function ev(e: Omit<WireEvent, "seq">): WireEvent {
  seq += 1;
  return { seq, ...e } as WireEvent;
}
function created(id: number): WireEvent {
  return ev({ type: "run_created", run_id: id, trainer_type: "SFT", knobs: { lr: id }, total_steps: 100, num_chunks: 4 });
}

describe("run colours", () => {
  it("gives the first 24 runs perceptually distinct colours (ΔE76 >= 25 between any two)", () => {
    const colors = Array.from({ length: 24 }, (_, i) => runColor(i + 1));
    expect(new Set(colors).size).toBe(24);
    let min = Infinity;
    for (let i = 0; i < colors.length; i++) for (let j = i + 1; j < colors.length; j++) min = Math.min(min, deltaE(colors[i], colors[j]));
    expect(min).toBeGreaterThanOrEqual(25);
    // plotly's default palette repeated after 10: run 1 and run 11 looked the same.
    expect(runColor(11)).not.toBe(runColor(1));
  });

  it("keeps every run colour readable on a white page and on JupyterLab's dark backgrounds", () => {
    // WCAG relative luminance and contrast ratio.
    const lum = (hex: string) => {
      const n = parseInt(hex.slice(1), 16);
      const [r, g, b] = [(n >> 16) & 255, (n >> 8) & 255, n & 255].map((v) => {
        const u = v / 255;
        return u <= 0.04045 ? u / 12.92 : ((u + 0.055) / 1.055) ** 2.4;
      });
      return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    const contrast = (a: string, b: string) => {
      const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
      return (hi + 0.05) / (lo + 0.05);
    };
    expect(PALETTE.length).toBe(24);
    for (const c of PALETTE) {
      expect(contrast(c, "#ffffff"), `${c} on white`).toBeGreaterThanOrEqual(2);
      // --jp-layout-color0 / color1 of JupyterLab Dark
      expect(contrast(c, "#111111"), `${c} on #111111`).toBeGreaterThanOrEqual(3);
      expect(contrast(c, "#212121"), `${c} on #212121`).toBeGreaterThanOrEqual(3);
    }
  });

  it("tells runs that share a colour apart by dash style, for up to 96 runs", () => {
    expect(runColor(25)).toBe(runColor(1));
    expect(runDash(1)).toBe("solid");
    expect(runDash(24)).toBe("solid");
    expect(runDash(25)).not.toBe(runDash(1));
    const pairs = new Set(Array.from({ length: 4 * PALETTE.length }, (_, i) => `${runColor(i + 1)}|${runDash(i + 1)}`));
    expect(pairs.size).toBe(96);
  });

  it("draws each run's curve in its table colour and dash, in every chart", () => {
    const state = createState();
    const events: WireEvent[] = [];
    for (let id = 1; id <= 30; id++) {
      events.push(created(id));
      events.push(ev({ type: "metric", run_id: id, split: "train", step: 1, samples_seen: 8, metrics: { loss: 1 } }));
      events.push(ev({ type: "metric", run_id: id, split: "eval", step: 1, samples_seen: 8, metrics: { eval_loss: 1 } }));
    }
    ingest(state, events.map((e, i) => ({ ...e, seq: i + 1 })));
    const train = planChart(state, createChartBook("train", "loss")).traces;
    const evals = planChart(state, createChartBook("eval", "eval_loss")).traces;
    expect(train).toHaveLength(30);
    for (const t of [...train, ...evals]) {
      expect(t.color).toBe(runColor(t.runId));
      expect(t.dash).toBe(runDash(t.runId));
    }
  });
});

describe("downsampling (LTTB)", () => {
  const n = 10000;
  const x = Array.from({ length: n }, (_, i) => i + 1);
  // A decaying loss with noise and one spike at step 7000.
  const y = x.map((s) => 3 * Math.exp(-s / 2000) + 0.05 * Math.sin(s * 1.7) + (s === 7000 ? 2 : 0));

  it("keeps the requested number of points, the first and the last, in x order", () => {
    const d = lttb(x, y, 500);
    expect(d.x).toHaveLength(500);
    expect(d.x[0]).toBe(1);
    expect(d.x[499]).toBe(n);
    for (let i = 1; i < d.x.length; i++) expect(d.x[i]).toBeGreaterThan(d.x[i - 1]);
    d.x.forEach((xi, i) => expect(d.y[i]).toBe(y[xi - 1]));
  });

  it("keeps a one-step spike that decimation by stride would drop", () => {
    expect(lttb(x, y, 500).x).toContain(7000);
    const stride = x.filter((_, i) => i % 20 === 0);
    expect(stride).not.toContain(7000);
  });

  it("returns short series unchanged and drops null values", () => {
    expect(lttb([1, 2, 3], [1, 2, 3], 10)).toEqual({ x: [1, 2, 3], y: [1, 2, 3] });
    expect(lttb([1, 2, 3, 4], [1, null, 3, 4], 10)).toEqual({ x: [1, 3, 4], y: [1, 3, 4] });
  });

  it("draws full resolution inside a zoomed range, downsampled outside zoom", () => {
    const s = { x, y };
    const all = drawnPoints(s, null, 600);
    expect(all.sampled).toBe(true);
    expect(all.x).toHaveLength(600);
    const zoomed = drawnPoints(s, [4000, 4200], 600);
    expect(zoomed.sampled).toBe(false);
    // 201 points inside plus one neighbour on each side, so the line reaches the edges.
    expect(zoomed.x[0]).toBe(3999);
    expect(zoomed.x[zoomed.x.length - 1]).toBe(4201);
    expect(zoomed.x).toHaveLength(203);
  });
});

describe("chart plans at scale", () => {
  function runWithSteps(count: number): { state: ReturnType<typeof createState>; next: number } {
    const state = createState();
    const events: WireEvent[] = [{ seq: 1, type: "run_created", run_id: 1, total_steps: count, num_chunks: 4 } as WireEvent];
    for (let s = 1; s <= count; s++) {
      // one sample a step: x (samples seen, the charts' axis) reads as the step
      events.push({ seq: s + 1, type: "metric", run_id: 1, split: "train", step: s, samples_seen: s, metrics: { loss: 1 / s } });
    }
    ingest(state, events);
    return { state, next: count + 2 };
  }

  it("appends while a run has few points, then replaces its trace with a bounded downsample", () => {
    const { state, next } = runWithSteps(MAX_TRACE_POINTS);
    const book = createChartBook("train", "loss");
    expect(planChart(state, book).traces[0].x).toHaveLength(MAX_TRACE_POINTS);
    ingest(state, [{ seq: next, type: "metric", run_id: 1, split: "train", step: MAX_TRACE_POINTS + 1, samples_seen: MAX_TRACE_POINTS + 1, metrics: { loss: 0 } }]);
    const plan = planChart(state, book);
    expect(plan.extend.indices).toEqual([]);
    expect(plan.replace.indices).toEqual([0]);
    expect(plan.replace.x[0]).toHaveLength(MAX_TRACE_POINTS);
    expect(plan.replace.x[0][MAX_TRACE_POINTS - 1]).toBe(MAX_TRACE_POINTS + 1);
  });

  it("redraws a downsampled trace once new points fill a bucket, and a zoomed one only for points in range", () => {
    const { state, next } = runWithSteps(5000);
    const book = createChartBook("train", "loss");
    planChart(state, book);
    // 5,000 points in 1,000: a bucket holds 5 points.
    let seqNo = next;
    let step = 5000;
    const add = () => ingest(state, [{ seq: seqNo++, type: "metric", run_id: 1, split: "train", step: ++step, samples_seen: step, metrics: { loss: 0.1 } }]);
    const replaced: boolean[] = [];
    for (let i = 0; i < 10; i++) {
      add();
      replaced.push(planChart(state, book).replace.indices.length > 0);
    }
    expect(replaced).toEqual([false, false, false, false, true, false, false, false, false, true]);
    // The redraw that comes includes every point logged meanwhile (none is lost).
    book.range = [100, 200];
    planChart(state, book);
    add();
    expect(planIsEmpty(planChart(state, book))).toBe(true); // step 5011 is outside the zoom
    book.range = [100, 6000];
    planChart(state, book);
    add();
    expect(planChart(state, book).replace.indices).toEqual([0]);
  });

  it("shares a fixed point budget between the traces of a chart", () => {
    expect(tracePointLimit(1)).toBe(MAX_TRACE_POINTS);
    expect(tracePointLimit(48)).toBe(200);
    for (const n of [4, 16, 48]) expect(n * tracePointLimit(n)).toBeLessThanOrEqual(Math.max(POINT_BUDGET, 4 * MAX_TRACE_POINTS));
    // 48 runs of 2,000 steps: a full redraw draws 200 points per run, not 2,000.
    const state = createState();
    const events: WireEvent[] = [];
    let q = 0;
    for (let id = 1; id <= 48; id++) {
      events.push({ seq: ++q, type: "run_created", run_id: id } as WireEvent);
      for (let s = 1; s <= 2000; s++) events.push({ seq: ++q, type: "metric", run_id: id, split: "train", step: s, samples_seen: s, metrics: { loss: 1 / s } });
    }
    ingest(state, events);
    const plan = planChart(state, createChartBook("train", "loss"));
    expect(plan.traces).toHaveLength(48);
    expect(plan.traces.every((t) => t.x.length === 200)).toBe(true);
  });

  it("never sends more than MAX_TRACE_POINTS for a 10,000-step run, and all points when zoomed in", () => {
    const { state } = runWithSteps(10000);
    const book = createChartBook("train", "loss");
    const first = planChart(state, book);
    expect(first.traces[0].x.length).toBe(MAX_TRACE_POINTS);
    book.range = [5000, 5100];
    const zoom = planChart(state, book);
    expect(zoom.reset).toBe(true);
    expect(zoom.traces[0].x).toHaveLength(103);
    book.range = null;
    expect(planChart(state, book).traces[0].x).toHaveLength(MAX_TRACE_POINTS);
  });
});

describe("run table at scale", () => {
  function table(): ReturnType<typeof createState> {
    const state = createState();
    const raw: Omit<WireEvent, "seq">[] = [];
    for (let id = 1; id <= 5; id++) raw.push({ type: "run_created", run_id: id, total_steps: 10 });
    raw.push({ type: "metric", run_id: 1, split: "eval", step: 2, samples_seen: 16, metrics: { eval_loss: 2.0, eval_accuracy: 0.5 } });
    raw.push({ type: "metric", run_id: 2, split: "eval", step: 2, samples_seen: 16, metrics: { eval_loss: 1.5, eval_accuracy: 0.7 } });
    raw.push({ type: "metric", run_id: 3, split: "eval", step: 2, samples_seen: 16, metrics: { eval_loss: 3.0, eval_accuracy: 0.9 } });
    raw.push({ type: "run_status", run_id: 4, status: "stopped", reason: "pruned at chunk 1 (median rule)", pruned: true, has_error: false });
    raw.push({ type: "run_status", run_id: 5, status: "deleted", reason: null, has_error: false });
    ingest(state, raw.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent));
    return state;
  }

  it("reads pruned from the stop event's field, never its reason text, and groups pruned runs with deleted ones", () => {
    const state = table();
    expect(isPruned(state.runs.get(4)!)).toBe(true);
    expect(isCollapsible(state.runs.get(5)!)).toBe(true);
    expect(isCollapsible(state.runs.get(1)!)).toBe(false);
    ingest(state, [{ seq: 11, type: "run_status", run_id: 1, status: "stopped", reason: "pruned by hand", pruned: false, has_error: false }]);
    expect(isPruned(state.runs.get(1)!)).toBe(false);
    ingest(state, [{ seq: 12, type: "run_status", run_id: 1, status: "stopped", reason: "rank 3 of 4", pruned: true, has_error: false }]);
    expect(isPruned(state.runs.get(1)!)).toBe(true);
    // A resumed pruned run is an ordinary run again.
    ingest(state, [{ seq: 13, type: "run_status", run_id: 4, status: "pending", reason: null, has_error: false }]);
    expect(isPruned(state.runs.get(4)!)).toBe(false);
  });

  it("sorts by the best eval metric by default, runs without one last, by id with no metric", () => {
    const state = table();
    const live = () => [...state.runs.values()].filter((r) => !isCollapsible(r));
    // Runs 1-3 have eval_loss; 4 (pruned) and 5 (deleted) do not count.
    let sort = effectiveSort(state, { column: "auto", descending: false }, "eval_loss");
    expect(sort).toEqual({ column: "eval", descending: false });
    expect(sortRuns(live(), sort, "eval_loss")).toEqual([2, 1, 3]);
    // Higher is better for accuracy.
    sort = effectiveSort(state, { column: "auto", descending: false }, "eval_accuracy");
    expect(sortRuns(live(), sort, "eval_accuracy")).toEqual([3, 2, 1]);
    // A live run without an eval point (a new clone) joins the end: the sort stays on the metric.
    ingest(state, [{ seq: 11, type: "run_created", run_id: 6, total_steps: 10 }]);
    sort = effectiveSort(state, { column: "auto", descending: false }, "eval_loss");
    expect(sort).toEqual({ column: "eval", descending: false });
    expect(sortRuns(live(), sort, "eval_loss")).toEqual([2, 1, 3, 6]);
    // No metric at all yet: id order.
    expect(effectiveSort(state, { column: "auto", descending: false }, null)).toEqual({ column: "id", descending: false });
    // An explicit sort puts runs without the value last, whatever the direction.
    expect(sortRuns(live(), { column: "eval", descending: true }, "eval_loss")).toEqual([3, 1, 2, 6]);
    expect(sortRuns(live(), { column: "eval", descending: false }, "eval_loss")).toEqual([2, 1, 3, 6]);
  });

  it("sorts by a knob column: numbers by value, text in natural order, runs at the default last", () => {
    const state = createState();
    const knobs: Record<number, Record<string, unknown>> = {
      1: { lr: 3e-3, model: "r=16" }, 2: { lr: 1e-4, model: "r=8" }, 3: { model: "r=4" }, 4: { lr: 1e-3, model: "r=8" },
    };
    ingest(state, Object.entries(knobs).map(([id, k], i) => (
      { seq: i + 1, type: "run_created", run_id: Number(id), knobs: k, total_steps: 10 }) as WireEvent));
    const runs = [...state.runs.values()];
    expect(sortRuns(runs, { column: knobSort("lr"), descending: false }, null)).toEqual([2, 4, 1, 3]);
    // Descending reverses the values; the run without the knob stays last.
    expect(sortRuns(runs, { column: knobSort("lr"), descending: true }, null)).toEqual([1, 4, 2, 3]);
    // Ties fall back to the run id, in either direction.
    expect(sortRuns(runs, { column: knobSort("model"), descending: false }, null)).toEqual([3, 2, 4, 1]);
    expect(sortRuns(runs, { column: knobSort("model"), descending: true }, null)).toEqual([1, 2, 4, 3]);
    // effectiveSort never turns a knob sort into something else.
    expect(effectiveSort(state, { column: knobSort("lr"), descending: false }, "eval_loss")).toEqual(
      { column: "knob:lr", descending: false });
  });

  it("counts pruned runs apart from stopped ones in the header", () => {
    const state = table();
    ingest(state, [{ seq: 11, type: "run_status", run_id: 1, status: "stopped", reason: "stopped by user", has_error: false }]);
    expect(headerCounts(state).map(([t]) => t)).toEqual(["2 pending", "1 stopped", "1 pruned", "1 deleted"]);
  });

  it("hides stopped, pruned and deleted runs only when asked", () => {
    const state = table();
    ingest(state, [{ seq: 11, type: "run_status", run_id: 1, status: "stopped", reason: null, has_error: false }]);
    const none = { stopped: false, pruned: false, deleted: false };
    const shown = (hide: typeof none) => [...state.runs.values()].filter((r) => runShown(r, hide)).map((r) => r.id);
    expect(shown(none)).toEqual([1, 2, 3, 4, 5]);
    expect(shown({ ...none, pruned: true })).toEqual([1, 2, 3, 5]);
    expect(shown({ ...none, deleted: true })).toEqual([1, 2, 3, 4]);
    expect(shown({ ...none, stopped: true })).toEqual([2, 3, 4, 5]);
  });
});

describe("rows hold their places under the pointer (review finding 2)", () => {
  it("keeps the shown order while held, appends new rows, drops rows that left", async () => {
    const { heldOrder } = await import("../src/table");
    // The eval ranking changed from 1,2,3,4 to 1,4,2,3 (the review's shots 02 -> 03).
    expect(heldOrder([1, 2, 3, 4], [1, 4, 2, 3], true)).toEqual([1, 2, 3, 4]);
    expect(heldOrder([1, 2, 3, 4], [1, 4, 2, 3], false)).toEqual([1, 4, 2, 3]);
    // A clone appears while held: at the end, nothing else moves.
    expect(heldOrder([1, 2, 3, 4], [5, 1, 4, 2, 3], true)).toEqual([1, 2, 3, 4, 5]);
    // A run deleted (or filtered) while held leaves; the others keep their order.
    expect(heldOrder([1, 2, 3, 4], [4, 1, 3], true)).toEqual([1, 3, 4]);
    // Nothing shown yet: the wanted order.
    expect(heldOrder([], [3, 1, 2], true)).toEqual([3, 1, 2]);
  });
});

describe("keys outside the charts show the dash (review finding 4) and readable names (finding 7)", () => {
  it("run 25's swatch and glyph differ from run 1's while the colour stays", async () => {
    const { runKey, runColor, runDash } = await import("../src/palette");
    const one = runKey(1);
    const twentyFive = runKey(25);
    expect(twentyFive.color).toBe(one.color);
    expect(twentyFive.dash).toBe(runDash(25));
    expect(twentyFive.dash).not.toBe("solid");
    expect(twentyFive.css).not.toEqual(one.css);
    expect(twentyFive.glyph).not.toBe(one.glyph);
    expect(twentyFive.title).toContain("dashed");
    // The border keeps the run's colour (the browser test compares it with the curve's colour).
    for (const id of [1, 25, 49, 73]) expect(runKey(id).css.borderColor).toBe(runColor(id));
    // Runs 1, 25, 49 and 73 share a colour: four distinct keys.
    const keys = [1, 25, 49, 73].map((id) => JSON.stringify([runKey(id).css, runKey(id).glyph]));
    expect(new Set(keys).size).toBe(4);
    expect(one.css.background).toBe(runColor(1));
  });

  it("metric headers read as words; the waiting text says points come per chunk", async () => {
    const { readableMetric } = await import("../src/format");
    const { waitingText } = await import("../src/chartplan");
    const { createState, ingest } = await import("../src/state");
    expect(readableMetric("eval_loss")).toBe("eval loss");
    expect(readableMetric("eval_mean_token_accuracy")).toBe("eval mean token accuracy");
    expect(readableMetric("accuracy")).toBe("accuracy");
    const state = createState();
    ingest(state, [{ seq: 1, type: "run_created", run_id: 1 }, { seq: 2, type: "run_status", run_id: 1, status: "running" }]);
    expect(waitingText(state, "train")).toContain("each time it finishes a chunk");
    expect(waitingText(state, "train")).not.toContain("as it trains");
  });
});
