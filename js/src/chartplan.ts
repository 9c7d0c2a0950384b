/**
 * What the charts draw, from the state: which traces to add and which points to append (so the
 * view never redraws a chart except for another metric or zoom), the LTTB downsampling that
 * bounds a chart's points, the default metric and the text of an empty chart, the pruning rungs,
 * and the engine time split's figure. No DOM, so vitest drives it.
 */
import { has, TIME_FIELDS, type PanelState, type RunState, type Series, type TimeSplit } from "./state";
import { runColor, runDash, type Dash } from "./palette";
import { isCollapsible, isPruned } from "./table";
import { runName, runTitle } from "./names";

/** What the curves are drawn against. */
export type XAxis = "samples" | "step" | "time";
export const X_AXES: XAxis[] = ["samples", "step", "time"];
export const X_LABELS: Record<XAxis, string> = { samples: "samples seen", step: "optimizer step", time: "wall time (s)" };

/** Points with an x and a y, x ascending (what LTTB and the charts read). */
export type XY = Pick<Series, "x" | "y">;

/** A trained chunk's wall-clock span (a chunk_done row of the timeline). */
export interface ChunkSpan {
  start: number;
  end: number;
}

/** A run's chunk spans from the timeline, by end time (what `axisSeries` reads on the time axis). */
export function chunkSpans(state: Pick<PanelState, "timeline">, runId: number): ChunkSpan[] {
  const out: ChunkSpan[] = [];
  for (const row of state.timeline) {
    const { start, end } = row;
    if (row.run_id === runId && typeof start === "number" && typeof end === "number" && Number.isFinite(start) && end >= start) {
      out.push({ start, end });
    }
  }
  return out.sort((a, b) => a.end - b.end);
}

/**
 * Zero of the wall-time axis: the first metric's time, or the first chunk's start when earlier
 * (spread over their chunk, the first points fall before the time they were logged at).
 */
export function timeOrigin(state: Pick<PanelState, "t0" | "timeline">): number | null {
  let t0 = state.t0;
  for (const row of state.timeline) {
    if (typeof row.start === "number" && Number.isFinite(row.start) && (t0 === null || row.start < t0)) t0 = row.start;
  }
  return t0;
}

/**
 * Wall times of a series' points. The engine logs a chunk's metrics in one batch when the chunk
 * ends, so every step of a chunk carries the same time and the curve would climb in stairs:
 * one vertical riser per chunk. A block of points sharing a time is spread instead over the
 * chunk that logged it (the run's chunk_done whose end is the latest before that time), its
 * last point at the chunk's end; without that chunk (a log cut before its chunk_done), over the
 * gap since the run's previous block; the run's first block without one keeps its time.
 */
export function spreadTimes(t: readonly (number | null)[], chunks: readonly ChunkSpan[]): (number | null)[] {
  const out = t.slice();
  let prevEnd: number | null = null;
  for (let i = 0; i < t.length;) {
    const v = t[i];
    let j = i + 1;
    if (v === null || v === undefined || !Number.isFinite(v)) {
      i = j;
      continue;
    }
    while (j < t.length && t[j] === v) j++;
    let span: ChunkSpan | null = null;
    for (const c of chunks) {
      if (c.end <= v + 1e-6) span = c;
      else break;
    }
    const from = span !== null ? span.start : prevEnd;
    const to = span !== null ? Math.min(span.end, v) : v;
    if (from !== null && to > from && j - i > 1) {
      for (let k = i; k < j; k++) out[k] = from + ((to - from) * (k - i + 1)) / (j - i);
    } else if (from !== null && to > from) out[i] = to;
    prevEnd = v;
    i = j;
  }
  return out;
}

/**
 * A series against another x axis: the optimizer step or the seconds since the experiment's
 * first event (a chunk's points spread over the chunk: `spreadTimes`). Points without that x (an
 * event that had no step) are left out; samples seen is the series itself (no copy, so new
 * points append).
 */
export function axisSeries(s: Series, axis: XAxis, t0: number | null, chunks: readonly ChunkSpan[] = []): XY {
  if (axis === "samples") return s;
  const x: number[] = [];
  const y: (number | null)[] = [];
  const src = axis === "step" ? s.step : spreadTimes(s.t, chunks);
  const origin = axis === "time" ? (t0 ?? 0) : 0;
  let last = -Infinity;
  for (let i = 0; i < s.x.length; i++) {
    const v = src[i];
    // A clock that steps back (another machine, a resumed session) would break the ascending
    // order every lookup relies on: such a point is dropped.
    if (v === null || v === undefined || !Number.isFinite(v) || v - origin < last) continue;
    last = v - origin;
    x.push(last);
    y.push(s.y[i]);
  }
  return { x, y };
}

/** Bookkeeping metrics HF logs beside the real ones; not worth a "best". */
export function isBookkeepingMetric(metric: string): boolean {
  return /(_runtime|_per_second|^epoch$|^step$|^total_flos$|num_tokens)/.test(metric);
}
/** The eval metric shown by default: eval_loss if any run logged it, else the first real one. */
export function defaultMetric(names: Set<string>, preferred: string): string | null {
  if (names.has(preferred)) return preferred;
  const real = [...names].filter((n) => !isBookkeepingMetric(n)).sort();
  if (real.length) return real[0];
  const all = [...names].sort();
  return all.length ? all[0] : null;
}
/** Shown in place of a chart that has no point yet. */
export function waitingText(state: PanelState, split: "train" | "eval"): string {
  if (state.runs.size === 0) return "waiting for the runs to be created…";
  const active = [...state.runs.values()].filter((r) => r.status === "running" || r.status === "pending").length;
  if (active === 0) return split === "eval" ? "no eval points (no eval dataset, or no run finished a chunk)" : "no points";
  return split === "train"
    ? "waiting for the first chunk: runs take turns, and a run's loss appears each time it finishes a chunk"
    : "waiting for the first chunk: every run is evaluated after each chunk it trains";
}

/**
 * Largest-Triangle-Three-Buckets (Steinarsson 2013): keeps `threshold` points, first and last
 * included, choosing in each bucket the point that spans the largest triangle with its neighbours,
 * so spikes and the curve's shape survive. Points with a null y are dropped (a gap in a
 * downsampled line means nothing). x must be ascending.
 */
export function lttb(x: readonly number[], y: readonly (number | null)[], threshold: number): { x: number[]; y: number[] } {
  const xs: number[] = [];
  const ys: number[] = [];
  for (let i = 0; i < x.length; i++) {
    const v = y[i];
    if (v !== null && v !== undefined && Number.isFinite(v)) {
      xs.push(x[i]);
      ys.push(v);
    }
  }
  const n = xs.length;
  if (threshold >= n || threshold < 3) return { x: xs, y: ys };
  const outX = [xs[0]];
  const outY = [ys[0]];
  const every = (n - 2) / (threshold - 2);
  let a = 0;
  for (let i = 0; i < threshold - 2; i++) {
    const start = Math.floor(i * every) + 1;
    const end = Math.min(Math.floor((i + 1) * every) + 1, n - 1);
    // Average of the next bucket (the last point for the last bucket).
    const nStart = end;
    const nEnd = Math.min(Math.floor((i + 2) * every) + 1, n);
    let avgX = 0;
    let avgY = 0;
    for (let j = nStart; j < nEnd; j++) {
      avgX += xs[j];
      avgY += ys[j];
    }
    const cnt = Math.max(1, nEnd - nStart);
    avgX /= cnt;
    avgY /= cnt;
    let best = start;
    let bestArea = -1;
    for (let j = start; j < end; j++) {
      const area = Math.abs((xs[a] - avgX) * (ys[j] - ys[a]) - (xs[a] - xs[j]) * (avgY - ys[a]));
      if (area > bestArea) {
        bestArea = area;
        best = j;
      }
    }
    outX.push(xs[best]);
    outY.push(ys[best]);
    a = best;
  }
  outX.push(xs[n - 1]);
  outY.push(ys[n - 1]);
  return { x: outX, y: outY };
}

/**
 * What a chart draws of one series: the points inside the zoomed x range (plus one on each side,
 * so lines run to the edges), downsampled with LTTB to `maxPoints` when there are more. Zoomed in
 * far enough, that is every logged point.
 */
export function drawnPoints(
  s: XY,
  range: [number, number] | null,
  maxPoints: number,
): { x: number[]; y: (number | null)[]; sampled: boolean } {
  let lo = 0;
  let hi = s.x.length;
  if (range !== null) {
    // One finite point beyond each edge (past a NaN gap if need be): lines run to the edges, and a
    // zoom inside a gap still has the points that fit its y axis.
    const finite = (i: number) => { const v = s.y[i]; return v !== null && Number.isFinite(v); };
    while (lo < s.x.length && s.x[lo] < range[0]) lo++;
    lo = Math.max(0, lo - 1);
    while (lo > 0 && !finite(lo)) lo--;
    hi = lo;
    while (hi < s.x.length && s.x[hi] <= range[1]) hi++;
    while (hi < s.x.length && !finite(hi)) hi++;
    hi = Math.min(s.x.length, hi + 1);
  }
  const x = s.x.slice(lo, hi);
  const y = s.y.slice(lo, hi);
  if (x.length <= maxPoints) return { x, y, sampled: false };
  const d = lttb(x, y, maxPoints);
  return { x: d.x, y: d.y, sampled: true };
}

// ---------------------------------------------------------------------------------------------
// Curves: which traces to add and which points to append, so the view never redraws a chart
// except when the user picks another metric.

export interface TraceSpec {
  runId: number;
  name: string;
  /** The run's whole config, for hovers and titles. */
  title: string;
  color: string;
  x: number[];
  y: (number | null)[];
  dash: Dash;
  /** Deleted or pruned: drawn fainter. */
  faded: boolean;
}

/**
 * Points a chart draws in all: each canvas pass and each hover lookup walks every drawn point, so
 * the total is bounded whatever the runs log (a chart is a few hundred pixels wide: more points
 * than that per curve do not show). Each trace gets an equal share, between MIN and
 * MAX_TRACE_POINTS (LTTB above it).
 */
export const POINT_BUDGET = 9600;
export const MIN_TRACE_POINTS = 200;
export const MAX_TRACE_POINTS = 1000;

export function tracePointLimit(traces: number): number {
  return Math.max(MIN_TRACE_POINTS, Math.min(MAX_TRACE_POINTS, Math.floor(POINT_BUDGET / Math.max(1, traces))));
}

export interface ChartPlan {
  /** Draw from scratch (first draw, another metric, a new zoom range): `traces` is the whole figure. */
  reset: boolean;
  traces: TraceSpec[];
  /** New traces to add after the existing ones (one per new run). */
  add: TraceSpec[];
  /** Points to append to existing traces, by trace index (traces drawn at full resolution). */
  extend: { indices: number[]; x: number[][]; y: (number | null)[][] };
  /** Traces whose drawn points are replaced (downsampled ones that got new points). */
  replace: { indices: number[]; x: number[][]; y: (number | null)[][] };
  /** Traces whose name or fading changed (a run was deleted or pruned). */
  restyle: { indices: number[]; name: string[]; faded: boolean[] };
}

/** What one chart has drawn: its metric, the run of each trace, points drawn per run. */
export interface ChartBook {
  split: "train" | "eval";
  metric: string | null;
  drawnMetric: string | null;
  /** The x axis chosen, and the one the traces were drawn against. */
  xAxis: XAxis;
  drawnXAxis: XAxis;
  order: number[];
  /** Logged points of each run already reflected in its trace. */
  drawn: Map<number, number>;
  /** Runs whose trace holds a downsampled or clipped copy (so new points replace, not append). */
  sampled: Set<number>;
  style: Map<number, string>;
  /** The zoomed x range (null: all); `drawnRange` is the one the traces were drawn for. */
  range: [number, number] | null;
  drawnRange: [number, number] | null;
  maxPoints: number;
}

export function createChartBook(split: "train" | "eval", metric: string | null = null): ChartBook {
  return {
    split, metric, drawnMetric: null, xAxis: "samples", drawnXAxis: "samples", order: [], drawn: new Map(), sampled: new Set(), style: new Map(),
    range: null, drawnRange: null, maxPoints: MAX_TRACE_POINTS,
  };
}

/** A curve's name: the run's short name, and whether it was deleted or pruned. */
export function traceName(run: RunState): string {
  const name = runName(run);
  if (run.status === "deleted") return `${name} (deleted)`;
  return isPruned(run) ? `${name} (pruned)` : name;
}

/**
 * Compare the state with what the chart has drawn and return the minimal update; the book is
 * updated as if the plan were applied (apply it, or reset the book on failure).
 */
export function planChart(state: PanelState, book: ChartBook): ChartPlan {
  const plan: ChartPlan = {
    reset: false,
    traces: [],
    add: [],
    extend: { indices: [], x: [], y: [] },
    replace: { indices: [], x: [], y: [] },
    restyle: { indices: [], name: [], faded: [] },
  };
  const metric = book.metric;
  const axis = book.xAxis;
  // Each run's series against the chosen axis, built once per plan (a copy for step and time).
  const views = new Map<number, XY | undefined>();
  const t0 = axis === "time" ? timeOrigin(state) : null;
  const seriesOf = (run: RunState): XY | undefined => {
    if (metric === null) return undefined;
    if (views.has(run.id)) return views.get(run.id);
    const src = (book.split === "train" ? run.train : run.eval);
    const s = has(src, metric) ? src[metric] : undefined;
    const v = s === undefined ? undefined : axisSeries(s, axis, t0, axis === "time" ? chunkSpans(state, run.id) : []);
    views.set(run.id, v);
    return v;
  };
  const runsWithData = [...state.runs.values()]
    .filter((run) => (seriesOf(run)?.x.length ?? 0) > 0)
    .sort((a, b) => a.id - b.id);

  const sameRange = JSON.stringify(book.range) === JSON.stringify(book.drawnRange);
  let mustReset = book.drawnMetric !== metric || !sameRange || book.drawnXAxis !== axis;
  // More runs, fewer points each; redraw only when the share moved by a quarter (runs come in
  // batches as a search expands, so this happens a few times per experiment).
  const limit = tracePointLimit(runsWithData.length);
  if (mustReset || Math.abs(limit - book.maxPoints) > 0.25 * book.maxPoints) {
    mustReset = mustReset || limit !== book.maxPoints;
    book.maxPoints = limit;
  }
  if (!mustReset) {
    for (const run of runsWithData) {
      if ((seriesOf(run)?.x.length ?? 0) < (book.drawn.get(run.id) ?? 0)) mustReset = true;
    }
  }
  const styleKey = (run: RunState) => `${traceName(run)}|${isCollapsible(run)}`;
  const spec = (run: RunState): TraceSpec => {
    const s = seriesOf(run) ?? { x: [], y: [] };
    const d = drawnPoints(s, book.range, book.maxPoints);
    // On the time axis a chunk_done read after its metrics moves their x (spreadTimes): such a
    // trace is replaced, never appended to.
    if (d.sampled || book.range !== null || axis === "time") book.sampled.add(run.id);
    else book.sampled.delete(run.id);
    book.drawn.set(run.id, s.x.length);
    return {
      runId: run.id, name: traceName(run), title: runTitle(run), color: runColor(run.id), x: d.x, y: d.y,
      dash: runDash(run.id), faded: isCollapsible(run),
    };
  };
  if (mustReset) {
    plan.reset = true;
    book.drawnMetric = metric;
    book.drawnXAxis = axis;
    book.drawnRange = book.range;
    book.order = [];
    book.drawn = new Map();
    book.sampled = new Set();
    book.style = new Map();
    for (const run of runsWithData) {
      plan.traces.push(spec(run));
      book.order.push(run.id);
      book.style.set(run.id, styleKey(run));
    }
    return plan;
  }
  for (const run of runsWithData) {
    const s = seriesOf(run)!;
    const idx = book.order.indexOf(run.id);
    if (idx < 0) {
      plan.add.push(spec(run));
      book.order.push(run.id);
      book.style.set(run.id, styleKey(run));
      continue;
    }
    const drawn = book.drawn.get(run.id) ?? 0;
    if (s.x.length > drawn) {
      if (!book.sampled.has(run.id) && book.range === null && s.x.length <= book.maxPoints) {
        plan.extend.indices.push(idx);
        plan.extend.x.push(s.x.slice(drawn));
        plan.extend.y.push(s.y.slice(drawn));
        book.drawn.set(run.id, s.x.length);
      } else if (book.sampled.has(run.id) && !newPointsShow(s, drawn, book)) {
        // Leave the trace as drawn: the picture would move by less than one bucket (about a
        // pixel), and an update that redraws nothing is the cheapest one at 48 runs.
      } else {
        const t = spec(run);
        plan.replace.indices.push(idx);
        plan.replace.x.push(t.x);
        plan.replace.y.push(t.y);
      }
    }
    if (book.style.get(run.id) !== styleKey(run)) {
      plan.restyle.indices.push(idx);
      plan.restyle.name.push(traceName(run));
      plan.restyle.faded.push(isCollapsible(run));
      book.style.set(run.id, styleKey(run));
    }
  }
  return plan;
}

/**
 * Whether a downsampled or zoomed trace must be redrawn for the points logged since `drawn`: when
 * zoomed, only points inside the range show; otherwise once they fill one LTTB bucket
 * (length / maxPoints points), since fewer change the drawn line by about a pixel.
 */
export function newPointsShow(s: XY, drawn: number, book: ChartBook): boolean {
  if (book.range !== null) {
    for (let i = drawn; i < s.x.length; i++) if (s.x[i] >= book.range[0] && s.x[i] <= book.range[1]) return true;
    return false;
  }
  return s.x.length - drawn >= Math.max(1, Math.floor(s.x.length / book.maxPoints));
}

export function planIsEmpty(plan: ChartPlan): boolean {
  return !plan.reset && plan.add.length === 0 && plan.extend.indices.length === 0
    && plan.replace.indices.length === 0 && plan.restyle.indices.length === 0;
}

// ---------------------------------------------------------------------------------------------
// Engine time split (train / eval / generate / swap / other), summed from chunk_done events.

export interface TimeSplitFigure {
  categories: (keyof TimeSplit)[];
  rows: string[];
  values: Record<keyof TimeSplit, number[]>;
  total: number;
  /**
   * Share of engine time spent outside training, evaluation and generating the sample prompts
   * (swaps + other), 0..1: the generations were asked for, so they are work, not overhead.
   */
  overhead: number;
}

export function timeSplitFigure(state: PanelState): TimeSplitFigure {
  const categories = TIME_FIELDS.map(([key]) => key);
  const sum = (t: TimeSplit) => categories.reduce((acc, c) => acc + t[c], 0);
  const runs = [...state.runs.values()]
    .filter((r) => sum(r.time) > 0)
    .sort((a, b) => a.id - b.id);
  const rows = ["all runs", ...runs.map((r) => `run ${r.id}`)];
  const values = Object.fromEntries(categories.map((c) => [c, [state.time[c], ...runs.map((r) => r.time[c])]])) as
    Record<keyof TimeSplit, number[]>;
  const total = sum(state.time);
  const overhead = total > 0 ? (state.time.swap + state.time.other) / total : 0;
  return { categories, rows, values, total, overhead };
}
// ---------------------------------------------------------------------------------------------
// Rungs: where the pruner stopped a run, marked on the eval chart at the run's last eval point.

export interface Rung {
  runId: number;
  x: number;
  y: number;
  color: string;
  /** Hover text: the run and the pruner's own reason, e.g. "pruned at chunk 2 (rank 5 of 8)". */
  text: string;
}

/**
 * One rung per pruned run that has a point of the chart's metric: the eval curve ends where the
 * run was cut, so its last finite point is the rung. Train charts get none (the pruner ranks
 * runs on eval metrics, and the train curve's last step is not where the decision was made).
 */
export function pruneRungs(state: PanelState, split: "train" | "eval", metric: string | null): Rung[] {
  if (split !== "eval" || metric === null) return [];
  const out: Rung[] = [];
  for (const run of [...state.runs.values()].sort((a, b) => a.id - b.id)) {
    if (!isPruned(run)) continue;
    const s = run.eval[metric];
    if (!s) continue;
    let i = s.x.length - 1;
    while (i >= 0 && (s.y[i] === null || !Number.isFinite(s.y[i] as number))) i--;
    if (i < 0) continue;
    out.push({
      runId: run.id, x: s.x[i], y: s.y[i] as number, color: runColor(run.id),
      text: `run ${run.id}: ${run.reason ?? "pruned"}`,
    });
  }
  return out;
}
