// The canvas charts' geometry and the series they draw: ticks, ranges, hover lookup, drag zoom,
// emphasis, and the time split's bars.
import { describe, expect, it } from "vitest";
import {
  dashArray,
  dragZoom,
  extents,
  fmtHover,
  fmtTick,
  fromPx,
  isolatedPoints,
  nearestPoint,
  niceTicks,
  toPx,
  type DrawSeries,
  type Scales,
} from "../src/canvaschart";
import { drawSeries, seriesStyles, timeBars, EVAL_MARKER_RUNS } from "../src/scale";
import { createState, ingest, type WireEvent } from "../src/state";
import { runColor, runDash } from "../src/palette";
import {
  createChartBook,
  drawnPoints,
  planChart,
  timeSplitFigure,
} from "../src/chartplan";

function series(runId: number, x: number[], y: (number | null)[], extra: Partial<DrawSeries> = {}): DrawSeries {
  return {
    runId, name: `run ${runId}`, color: runColor(runId), dash: runDash(runId), x, y,
    shown: true, focused: false, opacity: 1, width: 1.5, markers: false, ...extra,
  };
}

const BOX = { left: 50, top: 10, width: 400, height: 200 };

describe("axis ticks", () => {
  it("picks 1/2/5 steps that cover the range without exceeding the tick count", () => {
    const t = niceTicks(0, 16096, 6);
    expect(t.step).toBe(5000);
    expect(t.ticks).toEqual([0, 5000, 10000, 15000]);
    const y = niceTicks(0.43, 6.92, 6);
    expect(y.step).toBe(2);
    expect(y.ticks).toEqual([2, 4, 6]);
    const small = niceTicks(0.1, 0.35, 5);
    expect(small.step).toBe(0.05);
    // no float noise such as 0.30000000000000004
    expect(small.ticks).toEqual([0.1, 0.15, 0.2, 0.25, 0.3, 0.35]);
    for (const [lo, hi, n] of [[0, 1, 4], [-3.2, 7.9, 8], [1e-5, 3e-5, 4], [0, 80096, 10]] as const) {
      const r = niceTicks(lo, hi, n);
      expect(r.ticks.length).toBeLessThanOrEqual(n + 1);
      expect(r.ticks.length).toBeGreaterThanOrEqual(2);
      expect(r.ticks.every((v) => v >= lo - 1e-12 && v <= hi + 1e-12)).toBe(true);
    }
  });

  it("labels thousands of samples as k and keeps the step's decimals", () => {
    expect(fmtTick(20000, 10000)).toBe("20k");
    expect(fmtTick(15000, 5000)).toBe("15k");
    expect(fmtTick(2500, 500)).toBe("2500");
    expect(fmtTick(4000, 2000)).toBe("4k");
    expect(fmtTick(500000, 1e5)).toBe("500k");
    expect(fmtTick(2e6, 5e5)).toBe("2M");
    expect(fmtTick(0.25, 0.05)).toBe("0.25");
    expect(fmtTick(0.3, 0.05)).toBe("0.30");
    expect(fmtTick(4, 2)).toBe("4");
    expect(fmtTick(0, 0.1)).toBe("0");
    expect(fmtTick(2e-5, 1e-5)).toBe("2e-5");
    expect(fmtHover(16096)).toBe("16096");
    expect(fmtHover(0.123456789)).toBe("0.12346");
  });

  /** The y tick labels a draw of these values would write (the same calls as CanvasChart.draw, 260 px high). */
  function yLabels(ys: number[]): string[] {
    const e = extents([series(1, ys.map((_, i) => 8 * i), ys)], null, null)!;
    const t = niceTicks(e.y[0], e.y[1], Math.floor(260 / 40));
    return t.ticks.map((v) => fmtTick(v, t.step));
  }

  it("gives a near-flat metric distinct tick labels (ln 2 give or take 1e-7)", () => {
    // review s5_p F5: every tick read "6.931e-1"
    const labels = yLabels([0.6931471, 0.6931473, 0.6931472]);
    expect(labels.length).toBeGreaterThan(2);
    expect(new Set(labels).size).toBe(labels.length);
    expect(labels.every((l) => l.startsWith("0.693147"))).toBe(true);
    // tiny values stay distinct in exponential form
    const tiny = yLabels([1.2e-6, 1.25e-6, 1.3e-6]);
    expect(new Set(tiny).size).toBe(tiny.length);
  });

  it("writes huge values in exponential form, never as an exponent with a k or M suffix", () => {
    // review s5_p F9: a diverged run's 1e30 loss read "2e+23M"
    const labels = yLabels([0.5, 1e30, 0.4]);
    for (const l of labels) expect(l).not.toMatch(/e[+-]?\d+[kM]$/);
    expect(labels).toContain("2e+29");
    expect(labels).toContain("1e+30");
    expect(fmtTick(5e9, 1e9)).toBe("5e+9");
    expect(fmtTick(4e8, 1e8)).toBe("400M");
  });
});

describe("ranges", () => {
  it("starts x at zero and pads y by 5 % over the shown points only", () => {
    const ext = extents([
      series(1, [8, 16, 24], [2, 1, 0]),
      series(2, [8, 16], [10, 20], { shown: false }),
      series(3, [8, 40], [null, 1.5]),
    ], null, null)!;
    expect(ext.x).toEqual([0, 40]);
    expect(ext.y[0]).toBeCloseTo(-0.1);
    expect(ext.y[1]).toBeCloseTo(2.1);
  });

  it("fits y to the points inside a zoomed x range, and keeps a zoomed y range", () => {
    const s = [series(1, [0, 10, 20, 30, 40], [9, 5, 4, 3, 0])];
    const ext = extents(s, [9, 31], null)!;
    expect(ext.x).toEqual([9, 31]);
    expect(ext.y[0]).toBeCloseTo(3 - 0.1);
    expect(ext.y[1]).toBeCloseTo(5 + 0.1);
    expect(extents(s, [9, 31], [1, 2])!.y).toEqual([1, 2]);
  });

  it("fits y to the finite points beside an x zoom that holds none (a NaN gap), not 0..1", () => {
    // review s5_p F8: drawn points of a zoom inside a gap: one finite point beyond each edge.
    const s = series(1, [23_992, 24_000, 27_200, 27_208], [0.52, null, null, 0.51]);
    const e = extents([s], [24_500, 26_500], null)!;
    expect(e.x).toEqual([24_500, 26_500]);
    expect(e.y[0]).toBeGreaterThan(0.4);
    expect(e.y[1]).toBeLessThan(0.6);
    expect(e.y[0]).toBeLessThan(0.51);
    expect(e.y[1]).toBeGreaterThan(0.52);
  });

  it("gives one point a readable range and nothing at all no range", () => {
    expect(extents([series(1, [8], [0.5])], null, null)).toEqual({ x: [0, 8], y: [0.45, 0.55] });
    expect(extents([series(1, [], [])], null, null)).toBeNull();
    expect(extents([series(1, [8], [1], { shown: false })], null, null)).toBeNull();
  });

  it("maps data to pixels and back", () => {
    const s: Scales = { x: [0, 100], y: [0, 10], box: BOX };
    expect(toPx(s, 0, 0)).toEqual([50, 210]);
    expect(toPx(s, 100, 10)).toEqual([450, 10]);
    const [x, y] = fromPx(s, ...toPx(s, 37, 2.5));
    expect(x).toBeCloseTo(37);
    expect(y).toBeCloseTo(2.5);
  });
});

describe("hover lookup", () => {
  const scales: Scales = { x: [0, 100], y: [0, 10], box: BOX };

  it("names the run whose drawn point is nearest the pointer, within the hover distance", () => {
    const s = [series(1, [10, 50, 90], [1, 5, 9]), series(2, [10, 50, 90], [2, 6, 8])];
    const [px, py] = toPx(scales, 50, 5.9);
    expect(nearestPoint(s, scales, px, py, 20)).toMatchObject({ series: 1, index: 1 });
    const [qx, qy] = toPx(scales, 90, 9);
    expect(nearestPoint(s, scales, qx + 3, qy, 20)).toMatchObject({ series: 0, index: 2 });
    // 30 px from every point: nothing
    expect(nearestPoint(s, scales, 450, 110, 20)).toBeNull();
  });

  it("skips hidden runs and gaps, and on a tie names the run drawn on top (focused, else later)", () => {
    const a = series(1, [50], [5]);
    const b = series(2, [50], [5]);
    const [px, py] = toPx(scales, 50, 5);
    // Drawn in series order, focused ones last: b is painted over a (review s5_p F10).
    expect(nearestPoint([a, b], scales, px, py, 20)!.series).toBe(1);
    expect(nearestPoint([{ ...a, focused: true }, b], scales, px, py, 20)!.series).toBe(0);
    expect(nearestPoint([a, { ...b, focused: true }], scales, px, py, 20)!.series).toBe(1);
    expect(nearestPoint([{ ...a, shown: false }, b], scales, px, py, 20)!.series).toBe(1);
    expect(nearestPoint([series(3, [50, 60], [null, 5])], scales, px, py, 20)).toBeNull();
  });

  it("does not answer for a point clipped out of a y zoom", () => {
    // y zoomed to 0.5..0.6; the point at 0.605 is 10 px above the plot's top: not drawn (review s5_p F11).
    const s = [series(1, [0, 8, 16], [0.55, 0.605, 0.55])];
    const zoomed: Scales = { x: [0, 16], y: [0.5, 0.6], box: { left: 40, top: 10, width: 400, height: 200 } };
    const hit = nearestPoint(s, zoomed, 240, 12, 20);
    expect(hit === null || s[hit.series].y[hit.index] !== 0.605).toBe(true);
    // the same point inside the plot answers
    expect(nearestPoint(s, { ...zoomed, y: [0.5, 0.61] }, 240, 12, 20)).toMatchObject({ series: 0, index: 1 });
  });
});

describe("drag zoom", () => {
  const scales: Scales = { x: [0, 100], y: [0, 10], box: BOX };

  it("zooms x only on a flat drag, y only on a tall one, both on a box; a click is no zoom", () => {
    const flat = dragZoom(scales, 250, 100, 290, 103)!;
    expect(flat.y).toBeNull();
    expect(flat.x![0]).toBeCloseTo(50);
    expect(flat.x![1]).toBeCloseTo(60);
    const tall = dragZoom(scales, 250, 30, 252, 110)!;
    expect(tall.x).toBeNull();
    expect(tall.y![0]).toBeCloseTo(5);
    expect(tall.y![1]).toBeCloseTo(9);
    const box = dragZoom(scales, 290, 110, 250, 30)!;
    expect(box.x![0]).toBeCloseTo(50);
    expect(box.x![1]).toBeCloseTo(60);
    expect(box.y![0]).toBeCloseTo(5);
    expect(box.y![1]).toBeCloseTo(9);
    expect(dragZoom(scales, 250, 100, 253, 102)).toBeNull();
  });

  it("redraws every logged point inside the zoomed range, and downsamples outside a zoom", () => {
    const x = Array.from({ length: 10000 }, (_, i) => 8 * (i + 1));
    const y = x.map((v) => Math.sin(v / 500));
    const zoomed = drawnPoints({ x, y }, [40000, 41600], 1000);
    expect(zoomed.sampled).toBe(false);
    // one point beyond each edge, so the line runs to the plot's border
    expect(zoomed.x[0]).toBe(39992);
    expect(zoomed.x[zoomed.x.length - 1]).toBe(41608);
    expect(zoomed.x.length).toBe(203);
    // Inside a NaN gap the finite point beyond each edge is kept, past the gap's other NaNs.
    const gap = y.map((v, i) => (i >= 2999 && i < 3400 ? Number.NaN : v));
    const inGap = drawnPoints({ x, y: gap }, [24_500, 26_500], 1000);
    expect(inGap.x[0]).toBe(23_992);
    expect(inGap.x[inGap.x.length - 1]).toBe(27_208);
    expect(Number.isFinite(inGap.y[0]) && Number.isFinite(inGap.y[inGap.y.length - 1])).toBe(true);
    const all = drawnPoints({ x, y }, null, 200);
    expect(all.sampled).toBe(true);
    expect(all.x.length).toBe(200);
    expect(all.x[0]).toBe(8);
    expect(all.x[199]).toBe(80000);
  });

  it("finds the points no line passes through (a run's only eval, a point between gaps)", () => {
    expect(isolatedPoints([5])).toEqual([0]);
    expect(isolatedPoints([5, 6])).toEqual([]);
    expect(isolatedPoints([1, null, 3, null, null, 4, 5, NaN, 6])).toEqual([0, 2, 8]);
    expect(isolatedPoints([])).toEqual([]);
  });

  it("uses the dash styles that tell runs sharing a colour apart, scaled with the width", () => {
    expect(dashArray("solid", 1.5)).toEqual([]);
    expect(dashArray("dash", 1.5)).toEqual([9, 6]);
    expect(dashArray("dash", 3)).toEqual([18, 12]);
    expect(new Set(["dash", "dot", "dashdot"].map((d) => JSON.stringify(dashArray(d as "dash", 1.5)))).size).toBe(3);
  });
});

let seq = 0;
function ev(e: Omit<WireEvent, "seq">): WireEvent {
  seq += 1;
  return { seq, ...e } as WireEvent;
}

function runsWithEval(n: number): ReturnType<typeof createState> {
  const state = createState();
  seq = 0;
  const events: WireEvent[] = [];
  for (let id = 1; id <= n; id++) {
    events.push(ev({ type: "run_created", run_id: id, trainer_type: "SFT", knobs: { lr: id }, total_steps: 100, num_chunks: 4 }));
    events.push(ev({ type: "metric", run_id: id, split: "eval", step: 1, samples_seen: 8, metrics: { eval_loss: id } }));
    events.push(ev({ type: "metric", run_id: id, split: "train", step: 1, samples_seen: 8, metrics: { loss: id } }));
  }
  ingest(state, events);
  return state;
}

describe("series emphasis", () => {
  const none = { stopped: false, pruned: false, deleted: false };

  it("fades every other run while runs are hovered or pinned, and draws those thick", () => {
    const state = runsWithEval(4);
    const plain = seriesStyles(state, [1, 2, 3, 4], "train", new Set(), new Set(), none);
    expect(plain.map((s) => [s.opacity, s.width, s.focused])).toEqual(Array(4).fill([1, 1.5, false]));
    const focus = seriesStyles(state, [1, 2, 3, 4], "train", new Set([3]), new Set(), none);
    expect(focus.map((s) => s.opacity)).toEqual([0.12, 0.12, 1, 0.12]);
    expect(focus.map((s) => s.width)).toEqual([1.5, 1.5, 3, 1.5]);
    expect(focus[2].focused).toBe(true);
  });

  it("lets only a shown run take the focus: a pinned run hidden by a filter fades nothing", () => {
    // review s5_p F4: run 3 pinned, then stopped and "hide stopped": its row is gone, it cannot be unpinned.
    const state = runsWithEval(3);
    ingest(state, [ev({ type: "run_status", run_id: 3, status: "stopped", reason: "stopped by user" })]);
    const styles = seriesStyles(state, [1, 2, 3], "train", new Set([3]), new Set(), { ...none, stopped: true });
    expect(styles[2].shown).toBe(false);
    expect(styles.slice(0, 2).map((st) => [st.opacity, st.width, st.focused])).toEqual([[1, 1.5, false], [1, 1.5, false]]);
    expect(styles[2].focused).toBe(false);
    // the same with a swatch-hidden pinned run, while another pinned run stays focused
    const swatch = seriesStyles(state, [1, 2, 3], "train", new Set([1, 2]), new Set([2]), none);
    expect(swatch.map((st) => st.opacity)).toEqual([1, 0.12, 0.12]);
    expect(swatch.map((st) => st.focused)).toEqual([true, false, false]);
  });

  it("hides runs by swatch and by status filter, and fades pruned and deleted ones", () => {
    const state = runsWithEval(4);
    ingest(state, [
      ev({ type: "run_status", run_id: 2, status: "stopped", reason: "stopped by user" }),
      ev({ type: "run_status", run_id: 3, status: "stopped", reason: "pruned at chunk 2", pruned: true }),
    ]);
    const styles = seriesStyles(state, [1, 2, 3, 4], "eval", new Set(), new Set([4]), { ...none, stopped: true });
    expect(styles.map((s) => s.shown)).toEqual([true, false, true, false]);
    const shownAll = seriesStyles(state, [1, 2, 3, 4], "eval", new Set(), new Set(), none);
    expect(shownAll.map((s) => s.opacity)).toEqual([1, 1, 0.35, 1]);
  });

  it("marks eval points only up to EVAL_MARKER_RUNS shown runs, then only for focused runs", () => {
    const state = runsWithEval(EVAL_MARKER_RUNS + 1);
    const ids = [...state.runs.keys()];
    const many = seriesStyles(state, ids, "eval", new Set([5]), new Set(), none);
    expect(many.filter((s) => s.markers).length).toBe(1);
    expect(many[4].markers).toBe(true);
    // one run hidden: back to EVAL_MARKER_RUNS shown, every curve marks its evaluations
    const fewer = seriesStyles(state, ids, "eval", new Set(), new Set([1]), none);
    expect(fewer.filter((s) => s.shown).every((s) => s.markers)).toBe(true);
    expect(seriesStyles(state, ids.slice(0, 3), "train", new Set([1]), new Set(), none).some((s) => s.markers)).toBe(false);
  });

  it("draws each planned trace in its run's colour and dash with its emphasis", () => {
    const state = runsWithEval(30);
    const book = createChartBook("train", "loss");
    const plan = planChart(state, book);
    const styles = seriesStyles(state, book.order, "train", new Set([25]), new Set([2]), none);
    const drawn = drawSeries(plan.traces, styles);
    expect(drawn.map((d) => d.runId)).toEqual(book.order);
    for (const d of drawn) {
      expect(d.color).toBe(runColor(d.runId));
      expect(d.dash).toBe(runDash(d.runId));
      expect(d.x).toEqual([8]);
      expect(d.y).toEqual([d.runId]);
    }
    expect(drawn[1].shown).toBe(false);
    expect(drawn[24]).toMatchObject({ focused: true, width: 3, opacity: 1, dash: "dash", color: drawn[0].color });
  });
});

describe("time split bars", () => {
  it("stacks train / eval / generate / swap / other per run on one scale, the all-runs row longest", () => {
    const state = createState();
    seq = 0;
    ingest(state, [
      ev({ type: "run_created", run_id: 1, trainer_type: "SFT", knobs: {}, total_steps: 10, num_chunks: 2 }),
      ev({ type: "run_created", run_id: 2, trainer_type: "SFT", knobs: {}, total_steps: 10, num_chunks: 2 }),
      ev({ type: "chunk_done", run_id: 1, chunk: 0, chunks_done: 1, train_s: 2.5, eval_s: 1, gen_s: 0.5, swap_s: 0.5, other_s: 0.5 }),
      ev({ type: "chunk_done", run_id: 2, chunk: 0, chunks_done: 1, train_s: 4, eval_s: 0, swap_s: 0.5, other_s: 0.5 }),
    ]);
    const fig = timeSplitFigure(state);
    const bars = timeBars(fig);
    expect(bars.map((b) => [b.label, b.runId, b.total])).toEqual([["all runs", null, 10], ["run 1", 1, 5], ["run 2", 2, 5]]);
    expect(bars.map((b) => b.widthPct)).toEqual([100, 50, 50]);
    expect(bars[1].segments.map((g) => [g.category, g.seconds, g.pct])).toEqual([
      ["train", 2.5, 50], ["eval", 1, 20], ["generate", 0.5, 10], ["swap", 0.5, 10], ["other", 0.5, 10],
    ]);
    expect(bars[2].segments.find((g) => g.category === "generate")!.seconds).toBe(0);
    expect(bars[2].segments.find((g) => g.category === "eval")!.pct).toBe(0);
  });
});
