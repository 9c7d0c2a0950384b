/**
 * The two charts (train and eval) and the bar above them that sets how every curve is drawn
 * (smoothing, log y, the x axis).
 *
 * Each chart keeps its own copy of its traces, changes them in place as plans come in
 * (./chartplan.ts), and draws a frame's changes in one canvas pass (./canvaschart.ts).
 */
import { CanvasChart, type Range, type RungMark } from "./canvaschart";
import {
  defaultMetric,
  planChart,
  planIsEmpty,
  pruneRungs,
  waitingText,
  X_AXES,
  X_LABELS,
  type ChartBook,
  type ChartPlan,
  type TraceSpec,
  type XAxis,
} from "./chartplan";
import { h } from "./dom";
import type { Parts } from "./frames";
import type { MessageKind } from "./messages";
import { drawSeries, seriesStyles } from "./scale";
import type { Session } from "./session";
import { lowerIsBetter } from "./state";
import { runShown } from "./table";
import { MAX_SMOOTHING, type ViewPrefs } from "./viewprefs";

/** One chart of the panel: what it plots, its title, the metric it shows until the user picks another. */
export interface ChartSpec {
  book: ChartBook;
  label: string;
  preferred: string;
}

interface Chart {
  book: ChartBook;
  div: HTMLDivElement;
  waiting: HTMLDivElement;
  select: HTMLSelectElement;
  xLabel: string;
  xText: HTMLSpanElement;
  plot: CanvasChart;
  options: string[];
  /** The metric shown until the user picks another (when some run logs it). */
  preferred: string;
  /** The emphasis last applied to the traces (skip identical redraws). */
  emphasisKey: string;
  /** The pruning rungs last drawn (skip identical redraws). */
  rungKey: string;
  /** What the canvas is to show, one trace per run in `book.order`, changed in place between draws. */
  traces: TraceSpec[];
  styles: ReturnType<typeof seriesStyles>;
  rungs: RungMark[];
  /** Changed since the canvas last drew. */
  dirty: boolean;
}

export interface ChartAreaContext {
  session: Session;
  scheduleRender: (what: Partial<Parts>) => void;
  /** Record what a frame changed in the charts (the update timings). */
  noteCall: (what: string) => void;
  say: (text: string, kind?: MessageKind) => void;
  /** The user changed a metric or how curves are drawn: remember it. */
  persistPrefs: () => void;
  /** The pointer is on a run's curve (null: on none). */
  onHover: (runId: number | null) => void;
}

/**
 * The notes under the curve tools, for what a setting does that the charts alone do not say:
 * on the wall-time axis the runs take turns on the device, so each curve rises in steps (it
 * moves during the run's own chunks, and its line crosses the others' turns); smoothing leaves
 * the eval chart as logged.
 */
export function curveNotes(view: { smoothing: number; xAxis: XAxis }): string[] {
  const out: string[] = [];
  if (view.xAxis === "time") {
    out.push("wall time: the runs take turns on the device, so each curve advances only during its own chunks " +
      "(the steps) and its line crosses the time the other runs trained");
  }
  if (view.smoothing > 0) out.push("smoothing applies to the train chart; eval curves (a point per chunk) are drawn as logged");
  return out;
}

export class ChartArea {
  /** The smoothing, log y and x axis controls. */
  readonly curveBar: HTMLDivElement;
  /** The charts side by side. */
  readonly row = h("div", { class: "rf-charts" });
  // How every curve is drawn (both charts): smoothing, log y, the x axis; remembered per experiment.
  private readonly curveView = { smoothing: 0, logY: false, xAxis: "samples" as XAxis };
  private readonly smoothInput: HTMLInputElement;
  private readonly smoothText = h("span", { class: "rf-smoothing-value", text: "0" });
  private readonly logInput = h("input", { type: "checkbox", "data-testid": "rf-logy" });
  private readonly xSelect = h("select", { "data-testid": "rf-xaxis" });
  /** What the chosen curve settings do that the charts cannot show by themselves. */
  private readonly curveNote = h("span", { class: "rf-curve-note", "data-testid": "rf-curve-note" });
  private readonly charts: Chart[];
  private readonly resizeObserver: ResizeObserver | null;

  /** `specs`: the charts, in their order on the page; the train chart first, then the eval chart. */
  constructor(private readonly ctx: ChartAreaContext, specs: ChartSpec[]) {
    const { smoothText, logInput, xSelect, curveView, curveNote } = this;
    const smoothInput = h("input", {
      type: "range", min: "0", max: String(MAX_SMOOTHING), step: "0.01", value: "0", "data-testid": "rf-smoothing",
      title: "smoothing of the train curves: an exponential moving average as TensorBoard draws it (0: off); the raw curve " +
        "stays, faint. Eval curves are drawn as logged: one point per chunk, which an average would misplace",
    });
    this.smoothInput = smoothInput;
    xSelect.replaceChildren(...X_AXES.map((a) => h("option", { value: a, text: X_LABELS[a] })));
    this.curveBar = h("div", { class: "rf-curvebar", "data-testid": "rf-curvebar" }, [
      h("label", {}, ["smoothing (train) ", smoothInput, smoothText]),
      h("label", {}, [logInput, " log y"]),
      h("label", {}, ["x ", xSelect]),
      curveNote,
    ]);
    smoothInput.addEventListener("input", () => {
      const w = Number(smoothInput.value);
      curveView.smoothing = Number.isFinite(w) ? Math.min(MAX_SMOOTHING, Math.max(0, w)) : 0;
      this.curveChanged();
    });
    logInput.addEventListener("change", () => {
      curveView.logY = logInput.checked;
      this.curveChanged();
    });
    xSelect.addEventListener("change", () => {
      curveView.xAxis = (X_AXES as string[]).includes(xSelect.value) ? (xSelect.value as XAxis) : "samples";
      this.curveChanged();
    });
    this.charts = specs.map((spec) => this.makeChart(spec));
    // Notebook panes resize on their own, not only with the window.
    this.resizeObserver =
      typeof ResizeObserver === "function"
        ? new ResizeObserver((entries) => {
            for (const e of entries) {
              const c = this.charts.find((ch) => ch.div === e.target);
              const box = e.contentRect;
              if (c && box.width > 0 && c.plot.resize(box.width, box.height)) c.plot.draw();
            }
          })
        : null;
    for (const c of this.charts) this.resizeObserver?.observe(c.div);
  }

  /** The eval chart's metric: the run table's eval column and its sort. */
  evalMetric(): string | null {
    return this.charts[1].book.metric;
  }

  /** What to remember of the charts: each chart's metric and how curves are drawn. */
  prefs(): Pick<ViewPrefs, "metrics" | "curves"> {
    return { metrics: { train: this.charts[0].preferred, eval: this.charts[1].preferred }, curves: { ...this.curveView } };
  }

  /** Bring back remembered metrics and curve settings. */
  restore(prefs: Pick<ViewPrefs, "metrics" | "curves">): void {
    for (const [i, m] of [prefs.metrics.train, prefs.metrics.eval].entries()) {
      if (m === null) continue;
      this.charts[i].preferred = m;
      this.charts[i].book.metric = m;
    }
    Object.assign(this.curveView, prefs.curves);
    this.applyCurveView();
  }

  /** Bring the charts up to the state: metric menus, new points, emphasis, rungs; then draw. */
  render(): void {
    const { state } = this.ctx.session;
    for (const chart of this.charts) {
      this.updateSelect(chart);
      const plan = planChart(state, chart.book);
      if (!planIsEmpty(plan)) this.applyPlan(chart, plan);
    }
    this.emphasizeAll();
  }

  /** Runs were hidden or shown: the charts' "waiting" notes may change. */
  updateSelects(): void {
    for (const c of this.charts) this.updateSelect(c);
  }

  // --- emphasis: hover a row to highlight its curves, click to pin, swatch to hide, filters ------

  /** The hovered, pinned or hidden runs changed: restyle the curves and draw. */
  emphasizeAll(): void {
    for (const c of this.charts) {
      this.emphasize(c);
      this.markRungs(c);
      this.flushChart(c);
    }
  }

  dispose(): void {
    this.resizeObserver?.disconnect();
    for (const c of this.charts) c.plot.destroy();
  }

  private applyCurveView(): void {
    const { curveView } = this;
    this.smoothInput.value = String(curveView.smoothing);
    this.smoothText.textContent = curveView.smoothing.toFixed(2);
    this.logInput.checked = curveView.logY;
    this.xSelect.value = curveView.xAxis;
    const note = curveNotes(curveView);
    this.curveNote.textContent = note.join(" · ");
    this.curveNote.style.display = note.length ? "" : "none";
    for (const c of this.charts) {
      c.plot.setCurveView(curveView);
      if (c.book.xAxis !== curveView.xAxis) {
        // Another x axis: a zoom made on the old one means nothing on the new.
        c.book.xAxis = curveView.xAxis;
        c.book.range = null;
        c.plot.resetZoom();
      }
      c.xLabel = X_LABELS[curveView.xAxis];
      c.xText.textContent = `vs ${c.xLabel}`;
      c.plot.setXLabel(c.xLabel);
      c.dirty = true;
    }
  }

  private curveChanged(): void {
    this.applyCurveView();
    this.ctx.persistPrefs();
    this.ctx.scheduleRender({ charts: true });
  }

  private makeChart({ book, label, preferred }: ChartSpec): Chart {
    const ctx = this.ctx;
    const split = book.split;
    const xLabel = X_LABELS[book.xAxis];
    const select = h("select", { "data-testid": `rf-metric-${split}` });
    const div = h("div", { class: "rf-chart-plot", "data-testid": `rf-chart-${split}` });
    const waiting = h("div", { class: "rf-chart-waiting", "data-testid": `rf-waiting-${split}` });
    const xText = h("span", { text: `vs ${xLabel}` });
    const head = h("div", { class: "rf-chart-head", title: "drag to zoom (a flat drag: x only, a tall one: y only); double-click, or Escape on the focused chart, to zoom out" },
      [h("span", { text: label }), " ", select, " ", xText]);
    this.row.append(h("div", { class: "rf-chart" }, [head, h("div", { class: "rf-chart-body" }, [div, waiting])]));
    const plot = new CanvasChart(div, {
      xLabel,
      // An eval curve has a point per chunk: averaging a few points misplaces each of them.
      smooths: split === "train",
      lowerFirst: (metric) => lowerIsBetter(metric),
      // A zoomed range redraws at full resolution inside it (planChart resets on a new range).
      onZoom: (range: Range | null) => {
        chart.book.range = range;
        chart.dirty = true;
        ctx.scheduleRender({ charts: true });
      },
      onHover: (id: number | null) => ctx.onHover(id),
    });
    const chart: Chart = {
      book, div, waiting, select, xLabel, xText, plot, options: [], preferred,
      emphasisKey: "", rungKey: "", traces: [], styles: [], rungs: [], dirty: false,
    };
    select.addEventListener("change", () => {
      chart.book.metric = select.value || null;
      // Another metric has its own scale: a zoom made on the old one would hide it (Plotly's
      // uirevision reset the axes with the metric too).
      chart.book.range = null;
      chart.plot.resetZoom();
      chart.dirty = true;
      if (chart.book.metric) chart.preferred = chart.book.metric;
      ctx.persistPrefs();
      ctx.scheduleRender({ charts: true, table: true });
    });
    return chart;
  }

  private updateSelect(chart: Chart): void {
    const { state, focus } = this.ctx.session;
    const names = chart.book.split === "train" ? state.trainMetrics : state.evalMetrics;
    const options = [...names].sort();
    if (chart.book.metric === null || !names.has(chart.book.metric)) {
      chart.book.metric = defaultMetric(names, chart.preferred);
    }
    if (options.join("\u0000") !== chart.options.join("\u0000")) {
      chart.options = options;
      chart.select.replaceChildren(...options.map((o) => h("option", { value: o, text: o })));
    }
    if (chart.book.metric !== null) chart.select.value = chart.book.metric;
    // No metric yet: say what the chart waits for instead of an empty menu and empty axes.
    chart.select.style.display = options.length ? "" : "none";
    const withData = chart.book.metric === null ? [] : [...state.runs.values()].filter(
      (r) => ((chart.book.split === "train" ? r.train : r.eval)[chart.book.metric!]?.x.length ?? 0) > 0);
    const empty = withData.length === 0;
    // Every run with points hidden (filters, swatches): say so rather than show an empty frame.
    const allHidden = !empty && withData.every((r) => !runShown(r, focus.hide) || focus.hiddenRuns.has(r.id));
    chart.waiting.textContent = empty ? waitingText(state, chart.book.split)
      : allHidden ? `every run with ${chart.book.metric} is hidden (by the "hide:" filters below, or a run swatch)` : "";
    chart.waiting.style.display = empty || allHidden ? "" : "none";
    chart.div.style.visibility = empty ? "hidden" : "";
  }

  /**
   * Apply a plan to the chart's own copy of its traces (no drawing here). Every change of a frame
   * (new points, new traces, names, emphasis, rungs) then reaches the canvas as one draw
   * (flushChart).
   */
  private applyPlan(chart: Chart, plan: ChartPlan): void {
    const noteCall = this.ctx.noteCall;
    const split = chart.book.split;
    if (plan.reset || plan.add.length) chart.emphasisKey = "";
    if (plan.reset) {
      chart.traces = plan.traces;
      chart.rungKey = "";
      chart.dirty = true;
      noteCall(`${split}:reset`);
      return;
    }
    if (plan.add.length) {
      chart.traces.push(...plan.add);
      noteCall(`${split}:add`);
    }
    plan.replace.indices.forEach((idx, k) => {
      chart.traces[idx] = { ...chart.traces[idx], x: plan.replace.x[k], y: plan.replace.y[k] };
    });
    if (plan.replace.indices.length) noteCall(`${split}:replace`);
    plan.extend.indices.forEach((idx, k) => {
      // The trace's arrays are its own copies (drawnPoints slices), so they grow in place.
      const t = chart.traces[idx];
      for (const v of plan.extend.x[k]) t.x.push(v);
      for (const v of plan.extend.y[k]) t.y.push(v);
    });
    if (plan.extend.indices.length) noteCall(`${split}:extend`);
    plan.restyle.indices.forEach((idx, k) => {
      chart.traces[idx] = { ...chart.traces[idx], name: plan.restyle.name[k], faded: plan.restyle.faded[k] };
      chart.emphasisKey = "";
    });
    chart.dirty = chart.dirty || !planIsEmpty(plan);
  }

  /** Draw the frame's changes of one chart in one canvas pass (see applyPlan). */
  private flushChart(chart: Chart): void {
    if (!chart.dirty) return;
    chart.dirty = false;
    this.ctx.noteCall(`${chart.book.split}:draw`);
    try {
      chart.plot.setXZoom(chart.book.drawnRange);
      chart.plot.setData(drawSeries(chart.traces, chart.styles), chart.rungs, chart.book.drawnMetric ?? "");
      chart.plot.draw();
    } catch (err) {
      // Whatever failed, the next render redraws this chart from the state.
      chart.book.drawnMetric = null;
      chart.emphasisKey = "";
      chart.rungKey = "";
      this.ctx.say(`chart error: ${String(err)}`, "error");
    }
  }

  private emphasize(chart: Chart): void {
    const { state, focus: f } = this.ctx.session;
    const order = chart.book.order;
    if (chart.book.drawnMetric === null) return;
    const focus = new Set(f.pinned);
    if (f.hover !== null) focus.add(f.hover);
    // Eval markers (one per chunk) of dozens of runs pile into a solid band: past a few runs only
    // the hovered or pinned runs show theirs; the curves still answer hover at every point.
    const styles = seriesStyles(state, order, chart.book.split, focus, f.hiddenRuns, f.hide);
    const key = JSON.stringify(styles);
    if (key === chart.emphasisKey) return;
    chart.emphasisKey = key;
    chart.styles = styles;
    this.ctx.noteCall(`${chart.book.split}:emphasis`);
    chart.dirty = true;
  }

  /**
   * Mark where each shown pruned run was cut: a cross at its last eval point, the pruner's reason
   * on hover.
   */
  private markRungs(chart: Chart): void {
    const { state, focus } = this.ctx.session;
    if (chart.book.drawnMetric === null) return;
    const rungs = pruneRungs(state, chart.book.split, chart.book.drawnMetric).filter((r) => {
      const run = state.runs.get(r.runId);
      return !!run && runShown(run, focus.hide) && !focus.hiddenRuns.has(r.runId);
    });
    const key = JSON.stringify(rungs);
    if (key === chart.rungKey) return;
    chart.rungKey = key;
    chart.rungs = rungs;
    this.ctx.noteCall(`${chart.book.split}:rungs`);
    chart.dirty = true;
  }
}
