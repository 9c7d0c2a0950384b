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
 * The smoothing is below; the geometry (extents, nearest point, drag ranges) is in pure functions
 * in ./chartgeometry.ts, tested with vitest. The class keeps a chart's state and its events and
 * hands the drawing to ./chartaxes.ts (the frame) and ./chartcurves.ts (the curves and rungs), the
 * hover to ./charthover.ts and the drag to ./chartzoom.ts.
 */
import { drawAxes, layoutPlot } from "./chartaxes";
import { clipToPlot, drawCurves, drawRungs, type PathRecord } from "./chartcurves";
import { extents, fmtHover, type DrawSeries, type PlotBox, type Range, type RungMark, type Scales } from "./chartgeometry";
import { hoverHit, showTip } from "./charthover";
import { ZoomDrag } from "./chartzoom";

export { fmtTick, logTicks, niceStep, niceTicks } from "./ticks";
export {
  dashArray,
  dragZoom,
  extents,
  fmtHover,
  fromPx,
  hoverRows,
  isolatedPoints,
  nearestIndex,
  nearestPoint,
  toPx,
  type DrawSeries,
  type HoverRow,
  type PlotBox,
  type Range,
  type RungMark,
  type Scales,
} from "./chartgeometry";
export type { PathRecord } from "./chartcurves";

// ---------------------------------------------------------------------------------------------
// Smoothing and log values: the lines drawn

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


/**
 * The lines a draw puts on the canvas: the series in axis units (log10 when log y), each one's
 * smoothing weight (0: drawn raw) and the line drawn on top (smoothed or raw).
 */
function curveLines(
  series: readonly DrawSeries[], curve: CurveView, chartSmooths: boolean,
): { axisSeries: DrawSeries[]; smoothW: number[]; mainY: (number | null)[][] } {
  const { logY, smoothing } = curve;
  const axisSeries = series.map((s) => (logY ? { ...s, y: logValues(s.y) } : s));
  const smoothW = series.map((s) => seriesSmoothing(s.y, smoothing, chartSmooths));
  const mainY = series.map((s, i) => {
    if (smoothW[i] <= 0) return axisSeries[i].y;
    const sm = smoothed(s.y, smoothW[i]);
    return logY ? logValues(sm) : sm;
  });
  return { axisSeries, smoothW, mainY };
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

/** The chart's text for a screen reader: what it plots, over which ranges, and how. */
function chartLabel(
  yLabel: string, xLabel: string, shownRuns: number, ext: { x: Range; y: Range }, curve: CurveView, zoomed: boolean,
): string {
  const { logY, smoothing } = curve;
  return `${yLabel} vs ${xLabel}, ${shownRuns} run${shownRuns === 1 ? "" : "s"}, `
    + `${xLabel} ${fmtHover(ext.x[0])} to ${fmtHover(ext.x[1])}, ${yLabel} ${fmtHover(logY ? 10 ** ext.y[0] : ext.y[0])} to ${fmtHover(logY ? 10 ** ext.y[1] : ext.y[1])}`
    + `${logY ? " (log scale)" : ""}${smoothing > 0 ? `, smoothed ${smoothing}` : ""}`
    + `${zoomed ? " (zoomed; Escape zooms out)" : ""}`;
}

export class CanvasChart {
  private readonly canvas: HTMLCanvasElement;
  private readonly ctx: CanvasRenderingContext2D | null;
  private readonly tip: HTMLDivElement;
  private readonly zoomDrag: ZoomDrag;
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
    const sel = document.createElement("div");
    sel.className = "rf-zoombox";
    sel.style.display = "none";
    this.zoomDrag = new ZoomDrag(sel);
    host.append(this.canvas, sel, this.tip);
    this.listen();
    this.watchTheme();
    (host as unknown as { rfInspect: () => ChartInspection }).rfInspect = () => this.inspect();
    this.watchDpr();
  }

  /**
   * JupyterLab marks a theme switch on <body> (data-jp-theme-name, data-jp-theme-light), VS Code
   * with body classes; either way the colours are read again and the chart redrawn.
   */
  private watchTheme(): void {
    if (typeof MutationObserver !== "function") return;
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

  /** The theme's colour and font, read from the page's CSS when not known. */
  private readTheme(): { fg: string; family: string } {
    if (this.theme === null) {
      const style = getComputedStyle(this.host);
      this.theme = { fg: style.color || "#1f2328", family: style.fontFamily || "sans-serif" };
    }
    return this.theme;
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
    const { logY } = this.curve;
    const lines = curveLines(this.series, this.curve, this.opts.smooths !== false);
    this.axisSeries = lines.axisSeries;
    this.smoothW = lines.smoothW;
    this.mainY = lines.mainY;
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
    this.setLabel(chartLabel(this.yLabel, this.opts.xLabel, shownRuns, ext, this.curve,
      this.xZoom !== null || this.yZoom !== null));
    const { fg, family } = this.readTheme();
    const layout = layoutPlot(ctx, ext, logY, this.width, this.height, family);
    const { scales } = layout;
    this.scales = scales;
    this.tickText = drawAxes(ctx, layout, { fg, xLabel: this.opts.xLabel, yLabel: this.yLabel, width: this.width });
    // Curves and rung marks, clipped to the plot.
    ctx.save();
    clipToPlot(ctx, scales);
    this.paths = drawCurves(ctx, this.axisSeries, this.mainY, this.smoothW, scales);
    drawRungs(ctx, this.rungs, scales, logY, family);
    ctx.restore();
    // The pointer may now be over another curve; a hover showing stale numbers is worse than none.
    if (this.lastMove !== null && !this.zoomDrag.active) this.hover(this.lastMove.x, this.lastMove.y);
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
    const hit = hoverHit({
      scales: this.scales, series: this.series, axisSeries: this.axisSeries, mainY: this.mainY, smoothW: this.smoothW,
      rungs: this.rungs, logY: this.curve.logY, smoothed,
      lowerFirst: () => (this.opts.lowerFirst ? this.opts.lowerFirst(this.yLabel) : true),
    }, px, py);
    this.hoverText = showTip(this.tip, hit, { xLabel: this.opts.xLabel, series: this.series, width: this.width, height: this.height });
    if (hit.runId !== this.hoverRun) {
      this.hoverRun = hit.runId;
      this.opts.onHover(hit.runId);
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
      if (this.zoomDrag.active) return;
      // One nearest-point scan per frame, however fast the pointer moves.
      if (this.hoverFrame) return;
      this.hoverFrame = requestAnimationFrame(() => {
        this.hoverFrame = 0;
        if (this.lastMove !== null && !this.zoomDrag.active) this.hover(this.lastMove.x, this.lastMove.y);
      });
    });
    on(this.canvas, "mouseleave", () => {
      this.lastMove = null;
      if (this.zoomDrag.active) return;
      this.hideHover();
    });
    on(this.canvas, "mousedown", (ev) => {
      if (ev.button !== 0 || this.scales === null) return;
      ev.preventDefault();
      // preventDefault also keeps the focus where it was: a click on a chart must not take
      // JupyterLab's notebook shortcuts away (the canvas suppresses them while focused).
      const [x, y] = this.local(ev);
      this.zoomDrag.begin(this.scales.box, x, y);
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
      if (!this.zoomDrag.active || this.scales === null) return;
      const [x, y] = this.local(ev);
      this.zoomDrag.track(this.scales.box, x, y);
    });
    on(window, "mouseup", (ev) => {
      if (!this.zoomDrag.active) return;
      const zoom = this.zoomDrag.finish(this.scales, () => this.local(ev));
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
