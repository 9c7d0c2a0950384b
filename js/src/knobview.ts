/**
 * Knobs -> metric: every run's knob values against one metric (its best or latest value), one
 * small scatter per knob that varies, on one canvas (the curve charts' reasons: a few hundred
 * points, no library needed). Pruned runs are crosses, stopped ones hollow, failed ones red
 * squares; hovering a point lights up the run's table row and curves, a click pins it (as a
 * click on its row does). The layout and the hit test are pure functions, tested with vitest.
 */
import { h } from "./dom";
import { fmtHover } from "./canvaschart";
import { runName } from "./names";
import { runColor } from "./palette";
import { has, setKnobs, type PanelState, type RunState } from "./state";
import { isPruned, knobColumns } from "./table";
import { niceTicks } from "./ticks";

export type Which = "best" | "latest";
export type Mark = "run" | "pruned" | "stopped" | "failed";

export interface KnobPoint {
  runId: number;
  name: string;
  color: string;
  mark: Mark;
  value: number;
  /** The knob's value as logged, per knob key. */
  knobs: Record<string, unknown>;
}

export interface KnobAxis {
  key: string;
  /** Numbers (log when every value is positive and they span 20x or more), or categories. */
  kind: "linear" | "log" | "category";
  categories: string[];
  min: number;
  max: number;
  /**
   * Some runs do not set this knob (runs created before a clone or a search added it): they sit
   * in their own slot, labelled DEFAULT_LABEL, at the axis's left end, apart from the values.
   */
  defaults: boolean;
  /**
   * Other knobs that vary together with this one: each of their values goes with one value of
   * it, run for run (the two LoRA configs of a grid set r, lora_alpha and target_modules at once).
   * Their plots would be the same points over other labels, so they share this one.
   */
  linked: string[];
}

/** How a run that does not set a knob reads: it trains with the library's default, not with "null". */
export const DEFAULT_LABEL = "(default)";
/** On a number axis with a default slot, the values start this share of the axis to the right. */
const DEFAULT_GAP = 0.22;

const absent = (v: unknown): boolean => v === null || v === undefined;

export interface KnobModel {
  metric: string | null;
  which: Which;
  axes: KnobAxis[];
  points: KnobPoint[];
  /** Runs (not deleted) with no finite value of the metric yet: counted, not drawn. */
  missing: number[];
  y: [number, number];
}

function markOf(run: RunState): Mark {
  if (run.status === "failed") return "failed";
  if (isPruned(run)) return "pruned";
  if (run.status === "stopped") return "stopped";
  return "run";
}

function category(v: unknown): string {
  if (absent(v)) return DEFAULT_LABEL;
  // a list (target_modules) reads as the table writes it, not as clipped JSON
  if (Array.isArray(v)) return v.map((x) => (typeof x === "string" ? x : JSON.stringify(x))).join(", ");
  return typeof v === "string" ? v : JSON.stringify(v) ?? DEFAULT_LABEL;
}

/**
 * The model of the view: the knobs that vary between the runs (a knob whose values never vary
 * is left out), each run's metric value (best or latest; NaN or not logged yet: counted in
 * `missing`), and each knob's axis.
 */
export function knobModel(state: PanelState, metric: string | null, which: Which): KnobModel {
  const keys = knobColumns(state);
  const runs = [...state.runs.values()].filter((r) => r.status !== "deleted").sort((a, b) => a.id - b.id);
  const points: KnobPoint[] = [];
  const missing: number[] = [];
  for (const run of runs) {
    const src = which === "best" ? run.best : run.latest;
    const v = metric !== null && has(src, metric) ? src[metric] : null;
    if (v === null || v === undefined || !Number.isFinite(v)) {
      missing.push(run.id);
      continue;
    }
    points.push({ runId: run.id, name: runName(run), color: runColor(run.id), mark: markOf(run), value: v, knobs: setKnobs(run) });
  }
  const allAxes: KnobAxis[] = keys.map((key) => {
    const all = runs.map((r) => {
      const set = setKnobs(r);
      return has(set, key) ? set[key] : null;
    });
    const vals = all.filter((v) => !absent(v));
    const defaults = vals.length < all.length;
    const nums = vals.filter((v): v is number => typeof v === "number" && Number.isFinite(v));
    if (nums.length === vals.length && nums.length > 0) {
      const min = Math.min(...nums);
      const max = Math.max(...nums);
      const log = min > 0 && max / min >= 20;
      return { key, kind: log ? "log" : "linear", categories: [], min: log ? Math.log10(min) : min, max: log ? Math.log10(max) : max, defaults, linked: [] };
    }
    const categories = [...(defaults ? [DEFAULT_LABEL] : []), ...[...new Set(vals.map(category))].sort()];
    return { key, kind: "category", categories, min: 0, max: Math.max(0, categories.length - 1), defaults, linked: [] };
  });
  const axes = linkAxes(allAxes, runs);
  let lo = Infinity;
  let hi = -Infinity;
  for (const p of points) {
    lo = Math.min(lo, p.value);
    hi = Math.max(hi, p.value);
  }
  const pad = hi > lo ? (hi - lo) * 0.08 : Math.abs(lo) * 0.1 || 1;
  const y: [number, number] = points.length ? [lo - pad, hi + pad] : [0, 1];
  return { metric, which, axes, points, missing, y };
}

/** A short knob name: the last part of its key ("peft_config.r" -> "r"). */
export const shortKey = (key: string): string => key.split(".").pop() ?? key;

/**
 * Knobs whose values go together run for run (one value of each with one value of the other,
 * both ways) make one plot: the same points over other labels. Its axis is the group's number
 * knob with the shortest name (r before lora_alpha), or its shortest-labelled one; the others
 * are named as linked.
 */
export function linkAxes(axes: KnobAxis[], runs: RunState[]): KnobAxis[] {
  const column = (key: string) => runs.map((r) => {
    const set = setKnobs(r);
    return has(set, key) && !absent(set[key]) ? JSON.stringify(set[key]) : "\u0000";
  });
  const together = (a: string[], b: string[]) => {
    const ab = new Map<string, string>();
    const ba = new Map<string, string>();
    for (let i = 0; i < a.length; i++) {
      if ((ab.get(a[i]) ?? b[i]) !== b[i] || (ba.get(b[i]) ?? a[i]) !== a[i]) return false;
      ab.set(a[i], b[i]);
      ba.set(b[i], a[i]);
    }
    return true;
  };
  const cols = new Map(axes.map((a) => [a.key, column(a.key)]));
  const labelLen = (a: KnobAxis) => Math.max(0, ...axisTicks(a).map(([, l]) => l.length));
  const rank = (a: KnobAxis): [number, number] => a.kind === "category" ? [1, labelLen(a)] : [0, shortKey(a.key).length];
  const taken = new Set<string>();
  const out: KnobAxis[] = [];
  for (const axis of axes) {
    if (taken.has(axis.key)) continue;
    const group = axes.filter((b) => !taken.has(b.key) && together(cols.get(axis.key)!, cols.get(b.key)!));
    for (const b of group) taken.add(b.key);
    const lead = [...group].sort((x, y) => {
      const [rx, ry] = [rank(x), rank(y)];
      return rx[0] - ry[0] || rx[1] - ry[1] || (x.key < y.key ? -1 : 1);
    })[0];
    out.push({ ...lead, linked: group.filter((b) => b !== lead).map((b) => b.key) });
  }
  return out;
}

/** Where a knob value sits on its axis, 0..1 (categories evenly spaced, a lone value centred). */
export function axisPos(axis: KnobAxis, v: unknown): number | null {
  if (axis.kind === "category") {
    const i = axis.categories.indexOf(category(v));
    if (i < 0) return null;
    return axis.categories.length === 1 ? 0.5 : i / (axis.categories.length - 1);
  }
  if (absent(v)) return axis.defaults ? 0 : null;
  if (typeof v !== "number" || !Number.isFinite(v)) return null;
  const t = axis.kind === "log" ? (v > 0 ? Math.log10(v) : null) : v;
  if (t === null) return null;
  const pos = axis.max > axis.min ? (t - axis.min) / (axis.max - axis.min) : 0.5;
  return axis.defaults ? DEFAULT_GAP + (1 - DEFAULT_GAP) * pos : pos;
}

/** An axis's tick positions (0..1) and labels: the categories, or the values' ends (and the default slot). */
export function axisTicks(axis: KnobAxis): [number, string][] {
  if (axis.kind === "category") {
    return axis.categories.map((c, i) => [axis.categories.length === 1 ? 0.5 : i / (axis.categories.length - 1), c]);
  }
  const ends: [number, string][] = axis.max > axis.min
    ? [[axisPos(axis, axis.kind === "log" ? 10 ** axis.min : axis.min)!, axisLabel(axis, axis.min)],
      [axisPos(axis, axis.kind === "log" ? 10 ** axis.max : axis.max)!, axisLabel(axis, axis.max)]]
    : [[axisPos(axis, axis.kind === "log" ? 10 ** axis.min : axis.min)!, axisLabel(axis, axis.min)]];
  return axis.defaults ? [[0, DEFAULT_LABEL], ...ends] : ends;
}

export interface Cell {
  axis: KnobAxis;
  left: number;
  top: number;
  width: number;
  height: number;
  /** The x tick labels, each cut into lines that fit its slot, centred at x (pixels). */
  ticks: { x: number; lines: string[] }[];
  /** The title under them: the knob's name, and the knobs linked to it. */
  title: string[];
}

export const CELL_W = 200;
export const CELL_H = 150;
const PAD = { left: 44, right: 10, top: 18, bottom: 30 };
/** The plot area's height in every cell; below it, as many label lines as the cell needs. */
const PLOT_H = CELL_H - PAD.top - PAD.bottom;
export const LINE_H = 12;
/** Points keep off the frame: the axis ends sit this share of the width inside it. */
const INSET = 0.08;
const inset = (t: number) => INSET + t * (1 - 2 * INSET);
/** At most this many lines for a tick label (a long target_modules list); the last ends in "…". */
const MAX_LINES = 3;

/** Text width in pixels at the view's 11 px font; the draw passes the canvas's own measure. */
export type Measure = (text: string) => number;
export const roughMeasure: Measure = (text) => text.length * 6.2;

/**
 * `text` in lines no wider than `width`: broken after ", " or spaces, a word too long for a line
 * cut with "…", and at most `maxLines` lines (the last ending in "…" when text is left over).
 */
export function wrapLabel(text: string, width: number, measure: Measure = roughMeasure, maxLines = MAX_LINES): string[] {
  const ellipsize = (t: string) => {
    let cut = t;
    while (cut.length > 1 && measure(`${cut}…`) > width) cut = cut.slice(0, -1);
    return `${cut}…`;
  };
  const fit = (t: string) => (measure(t) <= width ? t : ellipsize(t));
  const lines: string[] = [];
  let line = "";
  for (const w of text.split(/ +/)) {
    const next = line ? `${line} ${w}` : w;
    if (!line || measure(next) <= width) line = next;
    else {
      lines.push(line);
      line = w;
    }
  }
  if (line) lines.push(line);
  const out = lines.slice(0, maxLines).map(fit);
  if (lines.length > maxLines) out[maxLines - 1] = ellipsize(lines[maxLines - 1]);
  return out;
}

/** A cell's tick labels and title, fitted to its width; and the height they need below the plot. */
function cellLabels(axis: KnobAxis, left: number, width: number, measure: Measure): Pick<Cell, "ticks" | "title" | "height"> {
  const x0 = left + PAD.left;
  const x1 = left + width - PAD.right;
  const ticks = axisTicks(axis);
  const at = ticks.map(([t]) => x0 + inset(t) * (x1 - x0));
  const fitted = ticks.map(([, label], i) => {
    // half the gap to each neighbour, and never past the cell's edges
    const lo = i > 0 ? (at[i] - at[i - 1]) / 2 : at[i] - left;
    const hi = i < at.length - 1 ? (at[i + 1] - at[i]) / 2 : left + width - at[i];
    return { x: at[i], lines: wrapLabel(label, Math.max(12, 2 * Math.min(lo, hi) - 4), measure) };
  });
  const name = `${shortKey(axis.key)}${axis.kind === "log" ? " (log)" : ""}`;
  const title = wrapLabel([name, ...axis.linked.map(shortKey)].join(" · "), width - 8, measure, 2);
  const lines = Math.max(1, ...fitted.map((f) => f.lines.length)) + title.length;
  return { ticks: fitted, title, height: PAD.top + PLOT_H + 6 + lines * LINE_H };
}

/** One cell per knob (knobs that vary together share one), as many per row as fit in `width`. */
export function knobLayout(model: KnobModel, width: number, measure: Measure = roughMeasure): { cells: Cell[]; height: number } {
  const perRow = Math.max(1, Math.floor(width / CELL_W));
  const w = Math.max(CELL_W, Math.floor(width / Math.min(perRow, Math.max(1, model.axes.length))));
  const cells: Cell[] = model.axes.map((axis, i) => ({ axis, left: (i % perRow) * w, top: 0, width: w, ...cellLabels(axis, (i % perRow) * w, w, measure) }));
  // a row is as tall as its tallest cell's labels
  let top = 0;
  for (let r = 0; r * perRow < cells.length; r++) {
    const row = cells.slice(r * perRow, (r + 1) * perRow);
    const h = Math.max(...row.map((c) => c.height));
    for (const c of row) {
      c.top = top;
      c.height = h;
    }
    top += h;
  }
  return { cells, height: top };
}

/** A point's pixel position in a cell. */
export function pointPx(model: KnobModel, cell: Cell, p: KnobPoint): [number, number] | null {
  const t = axisPos(cell.axis, has(p.knobs, cell.axis.key) ? p.knobs[cell.axis.key] : null);
  if (t === null) return null;
  const x = cell.left + PAD.left + inset(t) * (cell.width - PAD.left - PAD.right);
  const [lo, hi] = model.y;
  const y = cell.top + PAD.top + (1 - (p.value - lo) / (hi - lo)) * PLOT_H;
  return [x, y];
}

/** The point nearest (x, y) within `maxDist` pixels, in any cell. */
export function knobHit(model: KnobModel, cells: Cell[], x: number, y: number, maxDist = 8): KnobPoint | null {
  let best: KnobPoint | null = null;
  let bestD = maxDist;
  for (const cell of cells) {
    if (x < cell.left || x > cell.left + cell.width || y < cell.top || y > cell.top + cell.height) continue;
    for (const p of model.points) {
      const at = pointPx(model, cell, p);
      if (at === null) continue;
      const d = Math.hypot(at[0] - x, at[1] - y);
      if (d <= bestD) {
        bestD = d;
        best = p;
      }
    }
  }
  return best;
}

function axisLabel(axis: KnobAxis, t: number): string {
  return axis.kind === "log" ? fmtHover(10 ** t) : fmtHover(t);
}

export interface KnobView {
  details: HTMLDetailsElement;
  update(state: PanelState, focus: ReadonlySet<number>): void;
  dispose(): void;
}

export function createKnobView(opts: {
  /** A point is hovered (null: none). */
  onHover: (runId: number | null) => void;
  /** A point was clicked: pin or unpin the run. */
  onPick: (runId: number) => void;
}): KnobView {
  const summary = h("summary", { text: "knobs → metric" });
  const metricSel = h("select", { "data-testid": "rf-knob-metric" });
  const whichSel = h("select", { "data-testid": "rf-knob-which" },
    [h("option", { value: "best", text: "best" }), h("option", { value: "latest", text: "latest" })]);
  const note = h("span", { class: "rf-knob-note", "data-testid": "rf-knob-note" });
  const canvas = h("canvas", { class: "rf-knob-canvas", "data-testid": "rf-knob-canvas" });
  const tip = h("div", { class: "rf-tip rf-knob-tip", "data-testid": "rf-knob-tip" });
  tip.style.display = "none";
  const body = h("div", { class: "rf-knob-body" }, [canvas, tip]);
  const bar = h("div", { class: "rf-curvebar" }, [h("label", {}, ["metric ", metricSel]), h("label", {}, ["value ", whichSel]), note]);
  const details = h("details", { open: "", "data-testid": "rf-knobs" }, [summary, bar, body]);
  let state: PanelState | null = null;
  let focus: ReadonlySet<number> = new Set();
  let metric: string | null = null;
  let which: Which = "best";
  let model: KnobModel | null = null;
  let cells: Cell[] = [];
  let hover: number | null = null;
  let drawKey = "";
  let draws = 0;
  let measure: Measure = roughMeasure;

  const redraw = () => {
    if (state) update(state, focus, true);
  };
  metricSel.addEventListener("change", () => {
    metric = metricSel.value || null;
    redraw();
  });
  whichSel.addEventListener("change", () => {
    which = whichSel.value === "latest" ? "latest" : "best";
    redraw();
  });
  details.addEventListener("toggle", redraw);

  function update(s: PanelState, f: ReadonlySet<number>, force = false): void {
    state = s;
    focus = f;
    const names = [...s.evalMetrics, ...[...s.trainMetrics].filter((n) => !s.evalMetrics.has(n))];
    if (metric === null || !names.includes(metric)) metric = names.includes("eval_loss") ? "eval_loss" : names.includes("loss") ? "loss" : names[0] ?? null;
    const opts = names.join("\u0000");
    if (metricSel.dataset.opts !== opts) {
      metricSel.dataset.opts = opts;
      metricSel.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
    }
    if (metric !== null) metricSel.value = metric;
    if (!details.open) return;
    const key = `${s.version}|${metric}|${which}|${[...f].join(",")}|${hover}|${details.clientWidth}`;
    if (!force && key === drawKey) return;
    drawKey = key;
    model = knobModel(s, metric, which);
    const m = model;
    const knobs = m.axes.reduce((n, a) => n + 1 + a.linked.length, 0);
    summary.textContent = m.axes.length
      ? `knobs → ${metric ?? "metric"} (${which}): ${knobs === 1 ? "1 knob that varies" : `${knobs} knobs that vary`}, ${m.points.length} run${m.points.length === 1 ? "" : "s"}`
      : "knobs → metric (no knob varies between the runs)";
    const together = m.axes.filter((a) => a.linked.length).map((a) => `${[a.key, ...a.linked].map(shortKey).join(", ")} vary together (one plot)`);
    note.textContent = (m.missing.length ? `no ${which} ${metric ?? "value"} yet: run${m.missing.length === 1 ? "" : "s"} ${m.missing.join(", ")} · ` : "")
      + together.map((t) => `${t} · `).join("") + "✕ pruned · ○ stopped · ■ failed";
    const width = Math.max(CELL_W, details.clientWidth - 8);
    const probe = canvas.getContext("2d");
    if (probe !== null) probe.font = "11px sans-serif";
    measure = probe === null ? roughMeasure : (t) => probe.measureText(t).width;
    const lay = knobLayout(m, width, measure);
    cells = lay.cells;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(Math.max(1, lay.height) * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${lay.height}px`;
    const ctx = canvas.getContext("2d");
    draws++;
    if (ctx === null) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, lay.height);
    const fg = getComputedStyle(details).color || "#1f2328";
    ctx.font = "11px sans-serif";
    const anyFocus = m.points.some((p) => f.has(p.runId));
    for (const cell of cells) {
      const x0 = cell.left + PAD.left;
      const x1 = cell.left + cell.width - PAD.right;
      const y0 = cell.top + PAD.top;
      const y1 = y0 + PLOT_H;
      ctx.strokeStyle = "rgba(128,128,128,0.35)";
      ctx.lineWidth = 1;
      ctx.strokeRect(x0 + 0.5, y0 + 0.5, x1 - x0, y1 - y0);
      ctx.fillStyle = fg;
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      // x ticks: the categories, or the values' ends, each in the lines that fit its slot
      let below = 0;
      for (const tick of cell.ticks) {
        tick.lines.forEach((line, i) => ctx.fillText(line, tick.x, y1 + 3 + i * LINE_H));
        below = Math.max(below, tick.lines.length);
      }
      // the knob's name (and the knobs linked to it) under the tick labels
      cell.title.forEach((line, i) => ctx.fillText(line, (x0 + x1) / 2, y1 + 6 + (below + i) * LINE_H));
      // y ticks on each cell's left
      const yt = niceTicks(m.y[0], m.y[1], 3);
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      for (const t of yt.ticks) {
        const py = y0 + (1 - (t - m.y[0]) / (m.y[1] - m.y[0])) * (y1 - y0);
        ctx.fillText(fmtHover(t), x0 - 3, py);
      }
      const order = [...m.points].sort((a, b) => Number(f.has(a.runId) || a.runId === hover) - Number(f.has(b.runId) || b.runId === hover));
      for (const p of order) {
        const at = pointPx(m, cell, p);
        if (at === null) continue;
        const on = f.has(p.runId) || p.runId === hover;
        ctx.globalAlpha = anyFocus && !on ? 0.3 : 1;
        const r = on ? 6 : 4;
        ctx.strokeStyle = p.mark === "failed" ? "#cf222e" : p.color;
        ctx.fillStyle = p.color;
        ctx.lineWidth = on ? 2.5 : 1.5;
        ctx.beginPath();
        if (p.mark === "pruned") {
          ctx.moveTo(at[0] - r, at[1] - r);
          ctx.lineTo(at[0] + r, at[1] + r);
          ctx.moveTo(at[0] + r, at[1] - r);
          ctx.lineTo(at[0] - r, at[1] + r);
          ctx.stroke();
        } else if (p.mark === "failed") {
          ctx.rect(at[0] - r, at[1] - r, 2 * r, 2 * r);
          ctx.stroke();
        } else {
          ctx.arc(at[0], at[1], r, 0, 2 * Math.PI);
          if (p.mark === "stopped") ctx.stroke();
          else ctx.fill();
        }
        if (on) {
          ctx.beginPath();
          ctx.strokeStyle = fg;
          ctx.lineWidth = 1;
          ctx.arc(at[0], at[1], r + 3, 0, 2 * Math.PI);
          ctx.stroke();
        }
      }
      ctx.globalAlpha = 1;
    }
  }

  const local = (ev: MouseEvent): [number, number] => {
    const r = canvas.getBoundingClientRect();
    return [ev.clientX - r.left, ev.clientY - r.top];
  };
  const onMove = (ev: MouseEvent) => {
    if (model === null) return;
    const [x, y] = local(ev);
    const p = knobHit(model, cells, x, y);
    const id = p ? p.runId : null;
    if (p) {
      const knobs = model.axes.flatMap((a) => [a.key, ...a.linked]).map((k) => `${shortKey(k)} ${fmtKnob(has(p.knobs, k) ? p.knobs[k] : null)}`);
      tip.replaceChildren(h("b", { text: p.name }), h("br"), `${model.metric} (${model.which}) ${fmtHover(p.value)}`,
        h("br"), knobs.join(" · "), ...(p.mark !== "run" ? [h("br"), p.mark] : []));
      tip.style.borderColor = p.color;
      tip.style.display = "";
      tip.style.left = `${Math.min(x + 12, Math.max(0, canvas.clientWidth - tip.offsetWidth))}px`;
      tip.style.top = `${Math.max(0, y - 10)}px`;
    } else tip.style.display = "none";
    if (id !== hover) {
      hover = id;
      opts.onHover(id);
      redraw();
    }
  };
  const onLeave = () => {
    tip.style.display = "none";
    if (hover !== null) {
      hover = null;
      opts.onHover(null);
      redraw();
    }
  };
  const onClick = (ev: MouseEvent) => {
    if (model === null) return;
    const [x, y] = local(ev);
    const p = knobHit(model, cells, x, y);
    if (p) opts.onPick(p.runId);
  };
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", onLeave);
  canvas.addEventListener("click", onClick);
  // What the browser test reads: the model and each point's pixel position in the last draw.
  (canvas as unknown as { rfInspect: () => unknown }).rfInspect = () => ({
    draws,
    metric: model?.metric ?? null,
    which: model?.which ?? null,
    axes: model?.axes.map((a) => a.key) ?? [],
    linked: Object.fromEntries(model?.axes.map((a) => [a.key, a.linked]) ?? []),
    width: canvas.clientWidth,
    // every label drawn under a plot, with its extent: x0..x1 (pixels) and its line's top
    labels: cells.flatMap((c) => [
      ...c.ticks.flatMap((t) => t.lines.map((text, i) => ({ knob: c.axis.key, kind: "tick", text, cell: [c.left, c.left + c.width],
        x0: t.x - measure(text) / 2, x1: t.x + measure(text) / 2, line: i, top: c.top }))),
      ...c.title.map((text, i) => ({ knob: c.axis.key, kind: "title", text, cell: [c.left, c.left + c.width],
        x0: c.left + (PAD.left + c.width - PAD.right) / 2 - measure(text) / 2, x1: c.left + (PAD.left + c.width - PAD.right) / 2 + measure(text) / 2, line: i, top: c.top })),
    ]),
    missing: model?.missing ?? [],
    points: model === null ? [] : model.points.flatMap((p) => cells.map((c) => {
      const at = pointPx(model!, c, p);
      return { runId: p.runId, knob: c.axis.key, mark: p.mark, value: p.value, x: at?.[0] ?? null, y: at?.[1] ?? null };
    })),
  });
  return {
    details,
    update: (s, f) => update(s, f),
    dispose: () => {
      canvas.removeEventListener("mousemove", onMove);
      canvas.removeEventListener("mouseleave", onLeave);
      canvas.removeEventListener("click", onClick);
    },
  };
}

export function fmtKnob(v: unknown): string {
  return typeof v === "number" ? fmtHover(v) : category(v);
}
