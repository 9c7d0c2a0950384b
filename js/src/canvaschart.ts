/**
 * The panel's curve charts: one 2D canvas per chart, drawn whole on every change.
 *
 * Why not Plotly (or uPlot): Plotly's SVG scatter costs one full pass per trace on every redraw
 * (supplyDefaults, calcdata, drawData), 50-100 ms at 48 runs on a 2-core machine, whatever the point
 * count. uPlot draws fast but wants every series on one shared x array; here each run has its own
 * x values (LTTB keeps different points per run, runs with other batch sizes log at other samples
 * seen), so joining them would fill a runs x union-of-x table with nulls on every update. A canvas
 * pass over a few thousand points is a few milliseconds, and hover, zoom, rung marks and emphasis
 * need nothing a plotting library would add.
 *
 * The geometry (ticks, extents, nearest point, drag ranges) is in pure functions below, tested
 * with vitest; the class only turns them into pixels and mouse handling.
 */
import type { Dash } from "./palette";
import { fmtTick, logTicks, niceTicks } from "./ticks";

export { fmtTick, logTicks, niceStep, niceTicks } from "./ticks";

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

// ---------------------------------------------------------------------------------------------
// Pure geometry

/**
 * TensorBoard's smoothing: an exponential moving average with its start-up bias removed (the
 * first values are not pulled towards zero), over the points as drawn. `weight` 0 is the raw
 * curve, 0.99 nearly flat. Non-finite points stay gaps and do not reset the average.
 */
export function smoothed(y: readonly (number | null)[], weight: number): (number | null)[] {
  const w = Math.min(0.999, Math.max(0, weight));
  if (w === 0) return y.slice();
  const out: (number | null)[] = [];
  let last = 0;
  let n = 0;
  for (const v of y) {
    if (v === null || !Number.isFinite(v)) {
      out.push(v);
      continue;
    }
    last = last * w + (1 - w) * v;
    n++;
    out.push(last / (1 - w ** n));
  }
  return out;
}

/**
 * A series with fewer finite points than this is too sparse to smooth: an eval curve of a few
 * chunks, whose average would drag each point towards the first (TensorBoard's smoothing is for
 * a dense, noisy train loss). It is drawn raw, with its points marked.
 */
export const SMOOTH_MIN_POINTS = 8;

/** The smoothing weight one series gets: `weight` for a dense series on a chart that smooths, else 0. */
export function seriesSmoothing(y: readonly (number | null)[], weight: number, chartSmooths = true): number {
  if (!chartSmooths || !(weight > 0)) return 0;
  let n = 0;
  for (const v of y) if (v !== null && Number.isFinite(v) && ++n >= SMOOTH_MIN_POINTS) return weight;
  return 0;
}

/** Values on a log axis: log10, and no point for zero or a negative value (a gap). */
export function logValues(y: readonly (number | null)[]): (number | null)[] {
  return y.map((v) => (v !== null && Number.isFinite(v) && v > 0 ? Math.log10(v) : null));
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

// ---------------------------------------------------------------------------------------------
// The chart

export interface CanvasChartOptions {
  xLabel: string;
  /** false: never smoothed (the eval chart: a point per chunk is too few to average). */
  smooths?: boolean;
  /** The multi-run hover lists the lowest value first (losses), else the highest. */
  lowerFirst?: (metric: string) => boolean;
  /** A drag or a double-click changed the x range (null: zoomed out). */
  onZoom: (x: Range | null) => void;
  /** The pointer is over a run's curve (null: over none). */
  onHover: (runId: number | null) => void;
}

const HOVER_PX = 20;
/** The multi-run hover lists this many runs, then "+N more runs". */
const MAX_HOVER_ROWS = 16;

function h(tag: string, cls: string, text: string): HTMLElement {
  const el = document.createElement(tag);
  el.className = cls;
  el.textContent = text;
  return el;
}
const RUNG_HOVER_PX = 9;
const FONT_PX = 11;
const MARGIN = { right: 10, top: 8, bottom: 34 };

/** What one curve's last draw put on the canvas: point count and summed pixel y, per path. */
export interface PathRecord {
  runId: number;
  raw: { n: number; ySum: number; alpha: number };
  smooth: { n: number; ySum: number; alpha: number } | null;
}

/** How the curves are drawn: smoothing weight (0: off) and a log y axis. */
export interface CurveView {
  smoothing: number;
  logY: boolean;
}

/** What the browser tests read off the chart element (a copy of what the last draw used). */
export interface ChartInspection {
  curve: CurveView;
  paths: PathRecord[];
  /** The rows of the hover as last shown (empty when hidden). */
  hover: string[];
  series: DrawSeries[];
  rungs: RungMark[];
  view: { x: Range; y: Range; plot: PlotBox; zoomed: boolean; xTicks: string[]; yTicks: string[] } | null;
  draws: number;
  /** The text colour of the last draw: the theme's, read from the page's CSS. */
  fg: string;
}

export class CanvasChart {
  private readonly canvas: HTMLCanvasElement;
  private readonly ctx: CanvasRenderingContext2D | null;
  private readonly tip: HTMLDivElement;
  private readonly sel: HTMLDivElement;
  private series: DrawSeries[] = [];
  /** The series in axis units (log10 when log y), and the line drawn on top (smoothed or raw). */
  private axisSeries: DrawSeries[] = [];
  private mainY: (number | null)[][] = [];
  /** Each series' smoothing weight in the last draw (0: drawn raw). */
  private smoothW: number[] = [];
  private curve: CurveView = { smoothing: 0, logY: false };
  private paths: PathRecord[] = [];
  private hoverText: string[] = [];
  private rungs: RungMark[] = [];
  private yLabel = "";
  private xZoom: Range | null = null;
  private yZoom: Range | null = null;
  private scales: Scales | null = null;
  private width = 0;
  private height = 0;
  /** The devicePixelRatio the backing store was sized for (a window moved to another screen changes it). */
  private dpr = 1;
  private dprQuery: MediaQueryList | null = null;
  private readonly onDprChange = () => {
    this.watchDpr();
    if (this.draws > 0) this.draw();
  };
  private label = "";
  private tickText: { x: string[]; y: string[] } = { x: [], y: [] };
  private draws = 0;
  /**
   * The theme's text colour and font, read once and again when the theme may have changed: a
   * getComputedStyle in every draw would force a style pass over the whole notebook page.
   */
  private theme: { fg: string; family: string } | null = null;
  private themeObserver: MutationObserver | null = null;
  private drag: { x: number; y: number } | null = null;
  private hoverRun: number | null = null;
  private hoverFrame = 0;
  private lastMove: { x: number; y: number } | null = null;
  private readonly off: (() => void)[] = [];

  constructor(private readonly host: HTMLElement, private opts: CanvasChartOptions) {
    this.canvas = document.createElement("canvas");
    this.canvas.className = "rf-canvas";
    // A canvas says nothing to a screen reader or the keyboard by itself: it is an image with a
    // label (redrawn with the chart), focusable, and Escape or 0 zooms out as a double-click does.
    this.canvas.setAttribute("role", "img");
    this.canvas.tabIndex = 0;
    // While the chart has the focus, its keys are its own (JupyterLab's "0 0" restarts the kernel).
    this.canvas.setAttribute("data-lm-suppress-shortcuts", "true");
    this.ctx = this.canvas.getContext("2d");
    this.tip = document.createElement("div");
    this.tip.className = "rf-tip";
    this.tip.dataset.testid = "rf-tooltip";
    this.tip.style.display = "none";
    this.sel = document.createElement("div");
    this.sel.className = "rf-zoombox";
    this.sel.style.display = "none";
    host.append(this.canvas, this.sel, this.tip);
    this.listen();
    // JupyterLab marks a theme switch on <body> (data-jp-theme-name, data-jp-theme-light), VS Code
    // with body classes; either way the colours are read again and the chart redrawn.
    if (typeof MutationObserver === "function") {
      this.themeObserver = new MutationObserver(() => {
        // Body classes also change for other reasons (a drag's cursor): redraw only on a new colour.
        const style = getComputedStyle(this.host);
        if (this.theme !== null && style.color === this.theme.fg && style.fontFamily === this.theme.family) return;
        this.theme = null;
        if (this.draws > 0) this.draw();
      });
      for (const target of [document.documentElement, document.body]) {
        if (target) this.themeObserver.observe(target, { attributes: true, attributeFilter: ["class", "data-jp-theme-name", "data-jp-theme-light"] });
      }
    }
    (host as unknown as { rfInspect: () => ChartInspection }).rfInspect = () => this.inspect();
    this.watchDpr();
  }

  /**
   * A devicePixelRatio change without a size change (the window dragged to a HiDPI screen, browser
   * zoom) must rebuild the backing store: matchMedia on the current ratio fires once it changes.
   */
  private watchDpr(): void {
    this.dprQuery?.removeEventListener("change", this.onDprChange);
    this.dprQuery = null;
    if (typeof window.matchMedia !== "function") return;
    this.dprQuery = window.matchMedia(`(resolution: ${window.devicePixelRatio || 1}dppx)`);
    this.dprQuery.addEventListener("change", this.onDprChange);
  }

  /**
   * The x range the charts' data was planned for (the zoomed range, or null). A y-only zoom stays:
   * x then follows the data as it grows, as Plotly's autorange did.
   */
  setXZoom(x: Range | null): void {
    this.xZoom = x;
  }

  /** Forget any zoom, x and y (another metric: its values have nothing to do with the old axis). */
  resetZoom(): void {
    this.xZoom = null;
    this.yZoom = null;
  }

  /** Smoothing and log y (a redraw applies them). */
  setCurveView(view: CurveView): void {
    this.curve = { smoothing: Math.min(0.999, Math.max(0, view.smoothing)), logY: view.logY };
  }

  /** The x axis's name (samples seen, optimizer step, wall time). */
  setXLabel(label: string): void {
    this.opts.xLabel = label;
  }

  setData(series: DrawSeries[], rungs: RungMark[], yLabel: string): void {
    this.series = series;
    this.rungs = rungs;
    this.yLabel = yLabel;
  }

  /** The container's size changed (ResizeObserver) or is read for the first time. */
  resize(width?: number, height?: number): boolean {
    const w = Math.round(width ?? this.host.clientWidth);
    const h = Math.round(height ?? this.host.clientHeight);
    const dpr = window.devicePixelRatio || 1;
    if (w === this.width && h === this.height && dpr === this.dpr) return false;
    this.width = w;
    this.height = h;
    this.dpr = dpr;
    this.theme = null;
    this.canvas.width = Math.max(1, Math.round(w * dpr));
    this.canvas.height = Math.max(1, Math.round(h * dpr));
    this.canvas.style.width = `${w}px`;
    this.canvas.style.height = `${h}px`;
    return true;
  }

  draw(): void {
    const ctx = this.ctx;
    if (this.width === 0 || (window.devicePixelRatio || 1) !== this.dpr) this.resize(this.width || undefined, this.height || undefined);
    this.draws++;
    if (ctx === null || this.width === 0 || this.height === 0) return;
    // The ratio the backing store was sized for, whatever the window's is now.
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.clearRect(0, 0, this.width, this.height);
    // Log y draws log10 of the values (no point for zero or below); smoothing draws the moving
    // average on top of the raw curve, which stays, faint, behind it.
    const { logY, smoothing } = this.curve;
    this.axisSeries = this.series.map((s) => (logY ? { ...s, y: logValues(s.y) } : s));
    this.smoothW = this.series.map((s) => seriesSmoothing(s.y, smoothing, this.opts.smooths !== false));
    this.mainY = this.series.map((s, i) => {
      if (this.smoothW[i] <= 0) return this.axisSeries[i].y;
      const sm = smoothed(s.y, this.smoothW[i]);
      return logY ? logValues(sm) : sm;
    });
    this.paths = [];
    const ext = extents(this.axisSeries, this.xZoom, this.yZoom);
    if (ext === null) {
      this.scales = null;
      this.setLabel(`${this.yLabel || "chart"} vs ${this.opts.xLabel}: no run shown`);
      // No point left under the pointer (every run hidden): drop a label and a row highlight
      // that would name a curve no longer drawn.
      this.hideHover();
      return;
    }
    const shownRuns = this.series.reduce((n, s) => n + (s.shown ? 1 : 0), 0);
    this.setLabel(`${this.yLabel} vs ${this.opts.xLabel}, ${shownRuns} run${shownRuns === 1 ? "" : "s"}, `
      + `${this.opts.xLabel} ${fmtHover(ext.x[0])} to ${fmtHover(ext.x[1])}, ${this.yLabel} ${fmtHover(logY ? 10 ** ext.y[0] : ext.y[0])} to ${fmtHover(logY ? 10 ** ext.y[1] : ext.y[1])}`
      + `${logY ? " (log scale)" : ""}${smoothing > 0 ? `, smoothed ${smoothing}` : ""}`
      + `${this.xZoom !== null || this.yZoom !== null ? " (zoomed; Escape zooms out)" : ""}`);
    if (this.theme === null) {
      const style = getComputedStyle(this.host);
      this.theme = { fg: style.color || "#1f2328", family: style.fontFamily || "sans-serif" };
    }
    const { fg, family } = this.theme;
    ctx.font = `${FONT_PX}px ${family}`;
    const maxY = Math.max(2, Math.floor(this.height / 40));
    const lin = logY ? null : niceTicks(ext.y[0], ext.y[1], maxY);
    const lg = logY ? logTicks(ext.y[0], ext.y[1], maxY) : null;
    const yTicks = { ticks: lin ? lin.ticks : lg!.at };
    const yText = lin ? lin.ticks.map((t) => fmtTick(t, lin.step)) : lg!.labels;
    const labelW = Math.max(0, ...yText.map((t) => ctx.measureText(t).width));
    const box: PlotBox = {
      left: Math.ceil(labelW + 6 + FONT_PX + 8),
      top: MARGIN.top,
      width: Math.max(10, this.width - Math.ceil(labelW + 6 + FONT_PX + 8) - MARGIN.right),
      height: Math.max(10, this.height - MARGIN.top - MARGIN.bottom),
    };
    const scales: Scales = { x: ext.x, y: ext.y, box };
    this.scales = scales;
    const xTicks = niceTicks(ext.x[0], ext.x[1], Math.max(2, Math.floor(box.width / 70)));

    // Grid and tick labels.
    ctx.lineWidth = 1;
    ctx.strokeStyle = "rgba(128,128,128,0.25)";
    ctx.setLineDash([]);
    ctx.globalAlpha = 1;
    ctx.beginPath();
    for (const t of yTicks.ticks) {
      const py = Math.round(toPx(scales, ext.x[0], t)[1]) + 0.5;
      ctx.moveTo(box.left, py);
      ctx.lineTo(box.left + box.width, py);
    }
    for (const t of xTicks.ticks) {
      const px = Math.round(toPx(scales, t, ext.y[0])[0]) + 0.5;
      ctx.moveTo(px, box.top);
      ctx.lineTo(px, box.top + box.height);
    }
    ctx.stroke();
    ctx.fillStyle = fg;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    yTicks.ticks.forEach((t, i) => ctx.fillText(yText[i], box.left - 4, toPx(scales, ext.x[0], t)[1]));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    this.tickText = { x: [], y: yText };
    for (const t of xTicks.ticks) {
      // The last label of a zoomed axis can sit at the right edge: keep it whole inside the canvas.
      const text = fmtTick(t, xTicks.step);
      this.tickText.x.push(text);
      const half = ctx.measureText(text).width / 2;
      const px = Math.min(this.width - half - 1, Math.max(half + 1, toPx(scales, t, ext.y[0])[0]));
      ctx.fillText(text, px, box.top + box.height + 4);
    }
    ctx.fillText(this.opts.xLabel, box.left + box.width / 2, box.top + box.height + 6 + FONT_PX + 2);
    ctx.save();
    ctx.translate(2 + FONT_PX / 2, box.top + box.height / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.textBaseline = "middle";
    ctx.fillText(this.yLabel, 0, 0);
    ctx.restore();

    // Curves, clipped to the plot (a little wider, so markers at the edges show whole).
    ctx.save();
    ctx.beginPath();
    ctx.rect(box.left - 3, box.top - 3, box.width + 6, box.height + 6);
    ctx.clip();
    const order = [...this.series.keys()].sort((a, b) => Number(this.series[a].focused) - Number(this.series[b].focused));
    const { x: xr, y: yr } = scales;
    const kx = box.width / (xr[1] - xr[0]);
    const ky = box.height / (yr[1] - yr[0]);
    const bottom = box.top + box.height;
    ctx.lineJoin = "round";
    const line = (xs: readonly number[], ys: readonly (number | null)[]): { n: number; ySum: number } => {
      ctx.beginPath();
      let pen = false;
      let n = 0;
      let ySum = 0;
      for (let i = 0; i < xs.length; i++) {
        const y = ys[i];
        if (y === null || !Number.isFinite(y)) {
          pen = false;
          continue;
        }
        const px = box.left + (xs[i] - xr[0]) * kx;
        const py = bottom - (y - yr[0]) * ky;
        if (pen) ctx.lineTo(px, py);
        else ctx.moveTo(px, py);
        pen = true;
        n++;
        ySum += py;
      }
      ctx.stroke();
      return { n, ySum };
    };
    for (const si of order) {
      const s = this.axisSeries[si];
      if (!s.shown || s.x.length === 0) continue;
      const main = this.mainY[si];
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      const record: PathRecord = { runId: s.runId, raw: { n: 0, ySum: 0, alpha: s.opacity }, smooth: null };
      const smoothOn = this.smoothW[si] > 0;
      if (smoothOn) {
        // The raw curve, thin and faint behind the smoothed one, as TensorBoard draws it.
        const alpha = s.opacity * 0.25;
        ctx.globalAlpha = alpha;
        ctx.lineWidth = 1;
        ctx.setLineDash([]);
        record.raw = { ...line(s.x, s.y), alpha };
      }
      ctx.globalAlpha = s.opacity;
      ctx.lineWidth = s.width;
      ctx.setLineDash(dashArray(s.dash, s.width));
      const drawn = line(s.x, main);
      if (smoothOn) record.smooth = { ...drawn, alpha: s.opacity };
      else record.raw = { ...drawn, alpha: s.opacity };
      this.paths.push(record);
      const dots = s.markers ? null : isolatedPoints(main);
      if (s.markers || dots!.length) {
        ctx.setLineDash([]);
        ctx.beginPath();
        const r = s.markers ? 2 : Math.max(1.5, s.width);
        for (const i of dots ?? s.x.keys()) {
          const y = main[i];
          if (y === null || !Number.isFinite(y)) continue;
          const px = box.left + (s.x[i] - xr[0]) * kx;
          const py = bottom - (y - yr[0]) * ky;
          ctx.moveTo(px + r, py);
          ctx.arc(px, py, r, 0, 2 * Math.PI);
        }
        ctx.fill();
      }
    }
    ctx.globalAlpha = 1;
    ctx.setLineDash([]);
    ctx.font = `14px ${family}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (const r of this.rungs) {
      const ry = logY ? (r.y > 0 ? Math.log10(r.y) : null) : r.y;
      if (ry === null) continue;
      const [px, py] = toPx(scales, r.x, ry);
      ctx.fillStyle = r.color;
      ctx.fillText("\u2715", px, py);
    }
    ctx.restore();
    // The pointer may now be over another curve; a hover showing stale numbers is worse than none.
    if (this.lastMove !== null && this.drag === null) this.hover(this.lastMove.x, this.lastMove.y);
  }

  private setLabel(text: string): void {
    if (text === this.label) return;
    this.label = text;
    this.canvas.setAttribute("aria-label", text);
  }

  private hideHover(): void {
    this.tip.style.display = "none";
    if (this.hoverRun !== null) {
      this.hoverRun = null;
      this.opts.onHover(null);
    }
  }

  /** Zoom out fully (double-click, Escape or 0). */
  private zoomOut(): void {
    if (this.xZoom === null && this.yZoom === null) return;
    const hadX = this.xZoom !== null;
    this.resetZoom();
    // An x zoom re-plans the data (full resolution inside it); a y-only zoom needs only a redraw.
    if (hadX) this.opts.onZoom(null);
    else this.draw();
  }

  private inspect(): ChartInspection {
    const s = this.scales;
    return {
      curve: { ...this.curve },
      paths: this.paths.map((p) => ({ runId: p.runId, raw: { ...p.raw }, smooth: p.smooth ? { ...p.smooth } : null })),
      hover: [...this.hoverText],
      series: this.series.map((d) => ({ ...d, x: d.x.slice(), y: d.y.slice() })),
      rungs: this.rungs.map((r) => ({ ...r })),
      view: s === null ? null : { x: [...s.x], y: [...s.y], plot: { ...s.box }, zoomed: this.xZoom !== null || this.yZoom !== null,
        xTicks: [...this.tickText.x], yTicks: [...this.tickText.y] },
      draws: this.draws,
      fg: this.theme?.fg ?? "",
    };
  }

  private local(ev: MouseEvent): [number, number] {
    const r = this.canvas.getBoundingClientRect();
    return [ev.clientX - r.left, ev.clientY - r.top];
  }

  private hover(px: number, py: number): void {
    const scales = this.scales;
    const inside = scales !== null && px >= scales.box.left - HOVER_PX && px <= scales.box.left + scales.box.width + HOVER_PX
      && py >= scales.box.top - HOVER_PX && py <= scales.box.top + scales.box.height + HOVER_PX;
    let runId: number | null = null;
    let lines: string[] = [];
    let rows: HoverRow[] = [];
    let color = "";
    let at: [number, number] = [px, py];
    const logY = this.curve.logY;
    if (scales !== null && inside) {
      let rung: RungMark | null = null;
      let rungDist = RUNG_HOVER_PX;
      for (const r of this.rungs) {
        const ry = logY ? (r.y > 0 ? Math.log10(r.y) : null) : r.y;
        if (ry === null) continue;
        const [rx, rpy] = toPx(scales, r.x, ry);
        const d = Math.hypot(rx - px, rpy - py);
        if (d <= rungDist) {
          rung = r;
          rungDist = d;
          at = [rx, rpy];
        }
      }
      if (rung) {
        lines = [rung.text];
        color = rung.color;
        runId = rung.runId;
      } else {
        // Every shown run's value at the pointer's x, TensorBoard-style; the curve nearest the
        // pointer (if any within reach) is the one named in the table and drawn bold here.
        const main = this.axisSeries.map((s, i) => ({ ...s, y: this.mainY[i] }));
        const hit = nearestPoint(main, scales, px, py, HOVER_PX);
        const x = fromPx(scales, px, py)[0];
        // The logged values (where the curve is drawn): a smoothed value alone misreads a run
        // (1.087 shown where it logged 0.642), so it only comes second.
        const rawY = this.series.map((s, i) => s.y.map((v, k) => (this.mainY[i][k] === null ? null : v)));
        const smoothY = this.series.map((s, i) => (this.smoothW[i] > 0 ? smoothed(s.y, this.smoothW[i]) : null));
        const lower = this.opts.lowerFirst ? this.opts.lowerFirst(this.yLabel) : true;
        rows = hoverRows(this.series, rawY, x, lower, smoothY);
        if (hit !== null) {
          const s = this.series[hit.series];
          runId = s.runId;
          color = s.color;
        }
      }
    }
    if (lines.length === 0 && rows.length === 0) {
      this.tip.style.display = "none";
      this.hoverText = [];
    } else {
      if (rows.length) {
        const shown = rows.slice(0, MAX_HOVER_ROWS);
        const head = h("div", "rf-tip-head", `${this.opts.xLabel} ${fmtHover(rows.find((r) => r.runId === runId)?.x ?? rows[0].x)}`);
        const body = shown.map((r) => {
          const row = h("div", r.runId === runId ? "rf-tip-row rf-tip-hit" : "rf-tip-row", "");
          const key = h("span", "rf-tip-key", "\u25A0");
          key.style.color = r.color;
          const name = h("span", "rf-tip-name", r.name);
          const title = this.series.find((s) => s.runId === r.runId)?.title;
          if (title) name.title = title;
          row.append(key, name, h("span", "rf-tip-value", fmtHover(r.value)),
            ...(r.smoothed !== null ? [h("span", "rf-tip-smoothed", `smoothed ${fmtHover(r.smoothed)}`)] : []));
          return row;
        });
        // The hovered run's whole config: its short name shows two knobs at most.
        const hitTitle = this.series.find((s) => s.runId === runId)?.title;
        const full = hitTitle && hitTitle !== rows.find((r) => r.runId === runId)?.name
          ? [h("div", "rf-tip-full", hitTitle)] : [];
        const more = rows.length > shown.length ? [h("div", "rf-tip-more", `+${rows.length - shown.length} more runs`)] : [];
        this.tip.replaceChildren(head, ...full, ...body, ...more);
        this.tip.classList.remove("rf-tip-wrap");
        this.tip.classList.add("rf-tip-multi");
        this.hoverText = [head.textContent ?? "", ...shown.map((r) => `${r.name}: ${fmtHover(r.value)}`
          + `${r.smoothed !== null ? ` (smoothed ${fmtHover(r.smoothed)})` : ""}`)];
        if (color === "") color = "rgba(128,128,128,0.6)";
      } else {
        this.tip.replaceChildren(...lines.flatMap((l, i) => (i ? [document.createElement("br"), l] : [l])));
        // A pruner's reason wraps inside the chart.
        this.tip.classList.add("rf-tip-wrap");
        this.tip.classList.remove("rf-tip-multi");
        this.hoverText = [...lines];
      }
      this.tip.style.borderColor = color;
      this.tip.style.display = "";
      this.tip.style.left = "0px";
      // Beside the pointer (to its left in the right half), then clamped inside the chart by the
      // label's measured size: one layout read per hover change, not per draw.
      const w = this.tip.offsetWidth;
      const hgt = this.tip.offsetHeight;
      const want = at[0] > this.width / 2 ? at[0] - 14 - w : at[0] + 14;
      this.tip.style.left = `${Math.round(Math.max(0, Math.min(this.width - w, want)))}px`;
      this.tip.style.right = "";
      this.tip.style.top = `${Math.round(Math.max(0, Math.min(this.height - hgt, at[1] - 20)))}px`;
    }
    if (runId !== this.hoverRun) {
      this.hoverRun = runId;
      this.opts.onHover(runId);
    }
  }

  private listen(): void {
    const on = <K extends keyof HTMLElementEventMap>(t: EventTarget, type: K, fn: (ev: HTMLElementEventMap[K]) => void) => {
      t.addEventListener(type, fn as EventListener);
      this.off.push(() => t.removeEventListener(type, fn as EventListener));
    };
    on(this.canvas, "mousemove", (ev) => {
      const [x, y] = this.local(ev);
      this.lastMove = { x, y };
      if (this.drag !== null) return;
      // One nearest-point scan per frame, however fast the pointer moves.
      if (this.hoverFrame) return;
      this.hoverFrame = requestAnimationFrame(() => {
        this.hoverFrame = 0;
        if (this.lastMove !== null && this.drag === null) this.hover(this.lastMove.x, this.lastMove.y);
      });
    });
    on(this.canvas, "mouseleave", () => {
      this.lastMove = null;
      if (this.drag !== null) return;
      this.hideHover();
    });
    on(this.canvas, "mousedown", (ev) => {
      if (ev.button !== 0 || this.scales === null) return;
      ev.preventDefault();
      // preventDefault also keeps the focus where it was: a click on a chart must not take
      // JupyterLab's notebook shortcuts away (the canvas suppresses them while focused).
      const [x, y] = this.local(ev);
      // A drag that starts on the tick labels starts at the plot's edge, not at negative samples.
      const b = this.scales.box;
      this.drag = { x: Math.max(b.left, Math.min(b.left + b.width, x)), y: Math.max(b.top, Math.min(b.top + b.height, y)) };
      this.tip.style.display = "none";
    });
    on(this.canvas, "keydown", (ev) => {
      if (ev.key !== "Escape" && ev.key !== "0") return;
      if (this.xZoom === null && this.yZoom === null) return;
      ev.preventDefault();
      ev.stopPropagation();
      this.zoomOut();
    });
    on(window, "mousemove", (ev) => {
      if (this.drag === null || this.scales === null) return;
      const [x, y] = this.local(ev);
      const b = this.scales.box;
      const cx = Math.max(b.left, Math.min(b.left + b.width, x));
      const cy = Math.max(b.top, Math.min(b.top + b.height, y));
      const dx = Math.abs(cx - this.drag.x);
      const dy = Math.abs(cy - this.drag.y);
      // The box shows what a release would zoom to: a full-height band for an x-only drag.
      const xOnly = dy < 8;
      const yOnly = dx < 8 && !xOnly;
      const left = yOnly ? b.left : Math.min(cx, this.drag.x);
      const top = xOnly ? b.top : Math.min(cy, this.drag.y);
      Object.assign(this.sel.style, {
        display: dx < 5 && dy < 5 ? "none" : "",
        left: `${left}px`, top: `${top}px`,
        width: `${yOnly ? b.width : dx}px`, height: `${xOnly ? b.height : dy}px`,
      });
    });
    on(window, "mouseup", (ev) => {
      if (this.drag === null) return;
      const start = this.drag;
      this.drag = null;
      this.sel.style.display = "none";
      if (this.scales === null) return;
      const b = this.scales.box;
      const [x, y] = this.local(ev);
      const zoom = dragZoom(this.scales, start.x, start.y,
        Math.max(b.left, Math.min(b.left + b.width, x)), Math.max(b.top, Math.min(b.top + b.height, y)));
      if (zoom === null) return;
      // A y-only drag keeps x as it was (auto, following new steps, unless already zoomed); an
      // x-only drag fits y again.
      this.yZoom = zoom.y;
      if (zoom.x !== null) {
        this.xZoom = zoom.x;
        this.opts.onZoom(zoom.x);
      } else this.draw();
    });
    on(this.canvas, "dblclick", () => this.zoomOut());
  }

  destroy(): void {
    for (const f of this.off) f();
    this.off.length = 0;
    this.themeObserver?.disconnect();
    this.dprQuery?.removeEventListener("change", this.onDprChange);
    this.dprQuery = null;
    if (this.hoverFrame) cancelAnimationFrame(this.hoverFrame);
    delete (this.host as unknown as { rfInspect?: unknown }).rfInspect;
    this.canvas.width = 0;
    this.canvas.height = 0;
    this.host.replaceChildren();
  }
}
