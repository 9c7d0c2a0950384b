/**
 * The curve charts' pure geometry: what a draw maps where, which point the pointer is nearest,
 * what a drag selects. No canvas and no DOM, so vitest checks it as numbers; ./canvaschart.ts
 * turns it into pixels and mouse handling.
 */
import type { Dash } from "./palette";

/** One run's curve as drawn: its points and how it is emphasized now. */
export interface DrawSeries {
  runId: number;
  name: string;
  /** The run's whole config (its name shows two knobs at most). */
  title?: string;
  color: string;
  dash: Dash;
  x: number[];
  y: (number | null)[];
  /** false: hidden by a filter or its swatch (not drawn, not hovered, not in the y range). */
  shown: boolean;
  /** Hovered in the table or pinned: drawn on top, thicker. */
  focused: boolean;
  opacity: number;
  width: number;
  markers: boolean;
}

/** A pruning rung: a cross where the pruner cut a run, its reason on hover. */
export interface RungMark {
  runId: number;
  x: number;
  y: number;
  color: string;
  text: string;
}

export type Range = [number, number];

/** Plot area inside the canvas, in CSS pixels. */
export interface PlotBox {
  left: number;
  top: number;
  width: number;
  height: number;
}

/** The index of the finite point whose x is nearest to `x` (x ascending), or -1. */
export function nearestIndex(xs: readonly number[], ys: readonly (number | null)[], x: number): number {
  let lo = 0;
  let hi = xs.length - 1;
  if (hi < 0) return -1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  const ok = (i: number) => i >= 0 && i < xs.length && ys[i] !== null && Number.isFinite(ys[i] as number);
  // The nearest finite point on either side of the insertion point.
  let left = lo - 1;
  while (left >= 0 && !ok(left)) left--;
  let right = lo;
  while (right < xs.length && !ok(right)) right++;
  if (left < 0 && right >= xs.length) return -1;
  if (left < 0) return right;
  if (right >= xs.length) return left;
  return x - xs[left] <= xs[right] - x ? left : right;
}

/** One row of the multi-run hover: a run's value at the pointer's x. */
export interface HoverRow {
  runId: number;
  name: string;
  color: string;
  x: number;
  /** The value logged there (what the hover shows first), and the smoothed one (null: not smoothed). */
  value: number;
  smoothed: number | null;
}

/**
 * Every shown run's logged value at data x `x` (each at its own nearest point of `values`, the
 * points it draws), sorted by that value, as TensorBoard's tooltip lists them; the smoothed value
 * beside it where the series is smoothed (`smooth[i]`, null: raw).
 */
export function hoverRows(
  series: readonly DrawSeries[], values: readonly (number | null)[][], x: number, lowerFirst = true,
  smooth: readonly ((number | null)[] | null)[] = [],
): HoverRow[] {
  const rows: HoverRow[] = [];
  series.forEach((s, si) => {
    if (!s.shown) return;
    const i = nearestIndex(s.x, values[si], x);
    if (i < 0) return;
    const sm = smooth[si]?.[i];
    rows.push({ runId: s.runId, name: s.name, color: s.color, x: s.x[i], value: values[si][i] as number,
      smoothed: sm === null || sm === undefined || !Number.isFinite(sm) ? null : sm });
  });
  rows.sort((a, b) => (lowerFirst ? a.value - b.value : b.value - a.value) || a.runId - b.runId);
  return rows;
}

/** A value as hover text: five significant digits, integers whole. */
export function fmtHover(v: number): string {
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
  return String(Number(v.toPrecision(5)));
}

/**
 * The data ranges to draw: x from zero (a chart whose runs have one point each still gets a
 * readable axis) to the last point, or the zoomed range; y over the shown points inside that x
 * range, padded by 5 %, or the zoomed y range. Null when no shown series has a finite point.
 */
export function extents(series: readonly DrawSeries[], xZoom: Range | null, yZoom: Range | null): { x: Range; y: Range } | null {
  let xMin = Infinity;
  let xMax = -Infinity;
  let yMin = Infinity;
  let yMax = -Infinity;
  for (const s of series) {
    if (!s.shown) continue;
    for (let i = 0; i < s.x.length; i++) {
      const x = s.x[i];
      const y = s.y[i];
      if (y === null || !Number.isFinite(y) || !Number.isFinite(x)) continue;
      if (xZoom !== null && (x < xZoom[0] || x > xZoom[1])) continue;
      if (x < xMin) xMin = x;
      if (x > xMax) xMax = x;
      if (y < yMin) yMin = y;
      if (y > yMax) yMax = y;
    }
  }
  if (xMin > xMax && xZoom === null) return null;
  if (xZoom !== null && yMin > yMax) {
    // Nothing finite inside the zoom (a NaN gap, or past a run's end): fit y to the nearest finite
    // points on either side, which the drawn lines come from, rather than an arbitrary 0..1.
    let left: [number, number] | null = null;
    let right: [number, number] | null = null;
    for (const s of series) {
      if (!s.shown) continue;
      for (let i = 0; i < s.x.length; i++) {
        const x = s.x[i];
        const y = s.y[i];
        if (y === null || !Number.isFinite(y) || !Number.isFinite(x)) continue;
        if (x < xZoom[0] && (left === null || x > left[0])) left = [x, y];
        if (x > xZoom[1] && (right === null || x < right[0])) right = [x, y];
      }
    }
    for (const p of [left, right]) {
      if (p === null) continue;
      yMin = Math.min(yMin, p[1]);
      yMax = Math.max(yMax, p[1]);
    }
  }
  let x: Range;
  if (xZoom !== null) x = [xZoom[0], xZoom[1]];
  else {
    x = [Math.min(0, xMin), Math.max(0, xMax)];
    if (x[1] === x[0]) x = [x[0], x[0] + 1];
  }
  let y: Range;
  if (yZoom !== null) y = [yZoom[0], yZoom[1]];
  else if (yMin > yMax) y = [0, 1];
  else if (yMin === yMax) {
    const pad = Math.abs(yMin) > 0 ? Math.abs(yMin) * 0.1 : 1;
    y = [yMin - pad, yMax + pad];
  } else {
    const pad = (yMax - yMin) * 0.05;
    y = [yMin - pad, yMax + pad];
  }
  return { x, y };
}

/** Maps data to CSS pixels inside a plot box (y grows upwards). */
export interface Scales {
  x: Range;
  y: Range;
  box: PlotBox;
}

export function toPx(s: Scales, x: number, y: number): [number, number] {
  const px = s.box.left + ((x - s.x[0]) / (s.x[1] - s.x[0])) * s.box.width;
  const py = s.box.top + s.box.height - ((y - s.y[0]) / (s.y[1] - s.y[0])) * s.box.height;
  return [px, py];
}

export function fromPx(s: Scales, px: number, py: number): [number, number] {
  const x = s.x[0] + ((px - s.box.left) / s.box.width) * (s.x[1] - s.x[0]);
  const y = s.y[0] + ((s.box.top + s.box.height - py) / s.box.height) * (s.y[1] - s.y[0]);
  return [x, y];
}

/**
 * The drawn point nearest to the pointer, within `maxDist` pixels, among the shown series and
 * inside the plot's clip (3 px around the box: a point clipped out of a zoom is not seen, so it
 * does not answer). Ties go to the series drawn on top: focused ones, else the later one (draw
 * order), so the label names the line the user sees. Null when none is that close.
 */
export function nearestPoint(
  series: readonly DrawSeries[], scales: Scales, px: number, py: number, maxDist: number,
): { series: number; index: number; dist: number } | null {
  let best: { series: number; index: number; dist: number } | null = null;
  const { x: xr, y: yr, box } = scales;
  const kx = box.width / (xr[1] - xr[0]);
  const ky = box.height / (yr[1] - yr[0]);
  const bottom = box.top + box.height;
  const clip = 3;
  const minX = box.left - clip - px;
  const maxX = box.left + box.width + clip - px;
  const minY = box.top - clip - py;
  const maxY = bottom + clip - py;
  for (let si = 0; si < series.length; si++) {
    const s = series[si];
    if (!s.shown) continue;
    for (let i = 0; i < s.x.length; i++) {
      const y = s.y[i];
      if (y === null || !Number.isFinite(y)) continue;
      const dx = box.left + (s.x[i] - xr[0]) * kx - px;
      if (dx > maxDist || dx < -maxDist || dx < minX || dx > maxX) continue;
      const dy = bottom - (y - yr[0]) * ky - py;
      if (dy < minY || dy > maxY) continue;
      const d = Math.hypot(dx, dy);
      if (d > maxDist) continue;
      // Series are scanned in index order and drawn with the focused ones last: on a tie a later
      // series wins unless the best so far is focused and this one is not.
      if (best === null || d < best.dist - 1e-9
        || (Math.abs(d - best.dist) <= 1e-9 && (s.focused || !series[best.series].focused))) {
        best = { series: si, index: i, dist: d };
      }
    }
  }
  return best;
}

/**
 * What a drag selects, Plotly-style: a mostly horizontal drag zooms x only (y then fits the points
 * in range), a mostly vertical one zooms y only, anything else both; a few pixels is a click.
 */
export function dragZoom(
  scales: Scales, x0: number, y0: number, x1: number, y1: number,
): { x: Range | null; y: Range | null } | null {
  const dx = Math.abs(x1 - x0);
  const dy = Math.abs(y1 - y0);
  if (dx < 5 && dy < 5) return null;
  const [ax, ay] = fromPx(scales, Math.min(x0, x1), Math.max(y0, y1));
  const [bx, by] = fromPx(scales, Math.max(x0, x1), Math.min(y0, y1));
  const xOnly = dy < 8 && dx >= 5;
  const yOnly = dx < 8 && dy >= 5;
  return {
    x: yOnly ? null : [ax, bx],
    y: xOnly ? null : [ay, by],
  };
}

/**
 * Points no line passes through: finite, with no finite neighbour. A run with one eval so far (or
 * a point between gaps) would otherwise draw nothing where eval markers are off.
 */
export function isolatedPoints(y: readonly (number | null)[]): number[] {
  const ok = (i: number) => i >= 0 && i < y.length && y[i] !== null && Number.isFinite(y[i] as number);
  const out: number[] = [];
  for (let i = 0; i < y.length; i++) if (ok(i) && !ok(i - 1) && !ok(i + 1)) out.push(i);
  return out;
}

/** Canvas dash pattern for a Plotly dash name, scaled with the line width as Plotly does. */
export function dashArray(dash: Dash, width: number): number[] {
  const w = Math.max(1, width);
  switch (dash) {
    case "dash":
      return [6 * w, 4 * w];
    case "dot":
      return [1.5 * w, 2.5 * w];
    case "dashdot":
      return [6 * w, 3 * w, 1.5 * w, 3 * w];
    default:
      return [];
  }
}

/** A rung mark's y in axis units: log10 on a log axis, where zero and below have no place (null). */
export function rungAxisY(y: number, logY: boolean): number | null {
  return logY ? (y > 0 ? Math.log10(y) : null) : y;
}

/** A point moved inside the plot box (a drag that leaves it stops at its edge). */
export function clampToBox(box: PlotBox, x: number, y: number): { x: number; y: number } {
  return { x: Math.max(box.left, Math.min(box.left + box.width, x)), y: Math.max(box.top, Math.min(box.top + box.height, y)) };
}
