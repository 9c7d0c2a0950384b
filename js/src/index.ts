/**
 * The rapidfire_nb control panel: an anywidget ESM view (`render({model, el})`, returns its cleanup).
 *
 * Works the same in JupyterLab, Notebook 7, VS Code and Colab because it uses only the plain
 * anywidget model API (`model.get/on/off/send`). The state lives in ./state.ts (tested alone);
 * this file turns state changes into DOM updates and canvas draws: each chart keeps its own copy
 * of its traces, changes them in place, and draws a frame's changes in one canvas pass
 * (./canvaschart.ts). The run table (./tableview.ts), the boxes below it (./cloneview.ts,
 * ./tracebackview.ts, ./timesplit.ts, ./timeline.ts) and the worker notices (./workers.ts) are
 * views of their own; this file builds the header and the charts and wires the views together.
 */
import type { AnyModel, RenderProps } from "@anywidget/types";
import { Client, type Reply } from "./client";
import { CSS } from "./style";
import { h } from "./dom";
import { createCloneEditor } from "./cloneview";
import { createTracebackView } from "./tracebackview";
import { createTimeSplitView } from "./timesplit";
import { createRunTable, type Focus } from "./tableview";
import { suggestedRuns } from "./suggest";
import { createWorkerNotices } from "./workers";
import { createTimelineView } from "./timeline";
import { createKnobView } from "./knobview";
import { drawSeries, seriesStyles } from "./scale";
import { CanvasChart, type Range, type RungMark } from "./canvaschart";
import { loadPrefs, MAX_SMOOTHING, prefsKey, savePrefs, type ViewPrefs } from "./viewprefs";
import { runColor } from "./palette";
import { runTitle } from "./names";
import { lowerIsBetter } from "./state";
import {
  applySnapshot,
  createState,
  ingest,
  needsPull,
  noteKnownSeq,
  noteOnDevice,
  noteQueued,
  type PanelState,
} from "./state";
import { STATUS_COLORS } from "./palette";
import { headerCounts, headerCountTitle, knobColumns, runShown } from "./table";
import {
  createChartBook,
  defaultMetric,
  waitingText,
  planChart,
  planIsEmpty,
  pruneRungs,
  traceName,
  X_AXES,
  X_LABELS,
  type XAxis,
  type ChartBook,
  type ChartPlan,
  type TraceSpec,
} from "./chartplan";

type Model = AnyModel<{ snapshot: Record<string, unknown> }>;

const PULL_INTERVAL_MS = 1000;
/** How long an answer to a click stays in the message line (errors stay). */
const MESSAGE_CLEAR_MS = 15000;
/**
 * Pull anyway when no push arrived for this long (Colab drops background-thread pushes). A pull
 * is also how the view learns that the kernel went away (its send fails), so this bounds how long
 * a panel whose kernel restarted can still look live: about two seconds.
 */
const PUSH_SILENCE_MS = 1000;

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

/** One update's cost in the browser, as the browser test reads it from the panel element. */
interface UpdateTiming {
  events: number;
  runs: number;
  /** ingest (state) + render (DOM and canvas) work, excluding the wait for an animation frame. */
  workMs: number;
  ingestMs: number;
  renderMs: number;
  /** From the message's arrival to the charts being drawn, the frame wait included. */
  wallMs: number;
  /** What this update changed in the charts ("train:extend", "eval:emphasis", "train:draw", ...). */
  calls: string[];
}

/** The call that reopens this experiment after a restart: its name and the folder it lies in. */
function resumeCall(name: string | null, path: string | null): string {
  const parent = path !== null ? path.replace(/[\\/]+$/, "").replace(/[\\/][^\\/]*$/, "") : "";
  const where = parent !== "" && parent !== path ? `, experiment_path=${JSON.stringify(parent)}` : "";
  return `Experiment(${name !== null ? JSON.stringify(name) : "NAME"}${where}, resume=True)`;
}

function render({ model, el }: RenderProps<{ snapshot: Record<string, unknown> }>): () => void {
  const m = model as Model;
  const state: PanelState = createState();
  const client = new Client(m, undefined, (why) => disconnect(why));
  let disposed = false;
  /** Set once the kernel side is gone (restart, shutdown, closed comm): nothing can be sent. */
  let disconnected: string | null = null;
  let timer: ReturnType<typeof setInterval> | undefined = undefined;

  const style = h("style", { text: CSS });
  const root = h("div", { class: "rf-panel", "data-testid": "rf-panel" });
  el.append(style, root);

  // --- header ---------------------------------------------------------------------------------
  const title = h("span", { class: "rf-title", text: "RapidFire" });
  const counts = h("span", { class: "rf-counts" });
  const live = h("span", { class: "rf-live", "data-testid": "rf-live", text: "connecting…" });
  root.append(h("div", { class: "rf-header" }, [title, counts, live]));
  const banner = h("div", { class: "rf-banner", "data-testid": "rf-disconnected" });
  banner.style.display = "none";
  root.append(banner);

  // --- charts ---------------------------------------------------------------------------------
  const charts: Chart[] = [];
  // How every curve is drawn (both charts): smoothing, log y, the x axis; remembered per experiment.
  const curveView = { smoothing: 0, logY: false, xAxis: "samples" as XAxis };
  const smoothInput = h("input", {
    type: "range", min: "0", max: String(MAX_SMOOTHING), step: "0.01", value: "0", "data-testid": "rf-smoothing",
    title: "smoothing: an exponential moving average as TensorBoard draws it (0: off); the raw curve stays, faint",
  });
  const smoothText = h("span", { class: "rf-smoothing-value", text: "0" });
  const logInput = h("input", { type: "checkbox", "data-testid": "rf-logy" });
  const xSelect = h("select", { "data-testid": "rf-xaxis" });
  xSelect.replaceChildren(...X_AXES.map((a) => h("option", { value: a, text: X_LABELS[a] })));
  const curveBar = h("div", { class: "rf-curvebar", "data-testid": "rf-curvebar" }, [
    h("label", {}, ["smoothing ", smoothInput, smoothText]),
    h("label", {}, [logInput, " log y"]),
    h("label", {}, ["x ", xSelect]),
  ]);
  const chartsRow = h("div", { class: "rf-charts" });
  const legend = h("div", { class: "rf-legend", "data-testid": "rf-legend" });
  let legendKey = "";
  // A click on a key entry opens this: the run's note, saved into the experiment's log.
  const noteInput = h("input", { type: "text", maxlength: "2000", "data-testid": "rf-note-input", placeholder: "a note on this run (empty clears it)" });
  const noteSave = h("button", { text: "Save note", "data-testid": "rf-note-save" });
  const noteClose = h("button", { text: "Close", "data-role": "close" });
  const noteLabel = h("span", { class: "rf-note-label" });
  const noteBox = h("div", { class: "rf-notebox", "data-testid": "rf-notebox" }, [noteLabel, noteInput, noteSave, noteClose]);
  noteBox.style.display = "none";
  let noteRun: number | null = null;
  root.append(curveBar, chartsRow, legend, noteBox);
  function openNote(id: number): void {
    const run = state.runs.get(id);
    if (!run) return;
    noteRun = id;
    noteLabel.textContent = `note on ${traceName(run)}: `;
    noteInput.value = run.note ?? "";
    noteBox.style.display = "";
    noteInput.focus();
  }
  async function saveNote(): Promise<void> {
    if (noteRun === null || disconnected !== null) return;
    const id = noteRun;
    noteSave.disabled = true;
    const reply = await client.request({ type: "note", run_id: id, text: noteInput.value });
    noteSave.disabled = disconnected !== null;
    if (reply.ok) {
      say(`note on run ${id} saved`, "ok");
      noteBox.style.display = "none";
      noteRun = null;
      requestPull();
    } else say(`note on run ${id}: ${reply.error ?? "refused"}`, "error");
  }
  noteSave.addEventListener("click", () => void saveNote());
  noteInput.addEventListener("keydown", (ev) => {
    ev.stopPropagation();   // the notebook's shortcuts stay out of the field
    if (ev.key === "Enter") void saveNote();
    if (ev.key === "Escape") noteBox.style.display = "none";
  });
  noteClose.addEventListener("click", () => {
    noteBox.style.display = "none";
    noteRun = null;
  });
  function applyCurveView(): void {
    smoothInput.value = String(curveView.smoothing);
    smoothText.textContent = curveView.smoothing.toFixed(2);
    logInput.checked = curveView.logY;
    xSelect.value = curveView.xAxis;
    for (const c of charts) {
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
  function curveChanged(): void {
    applyCurveView();
    persistPrefs();
    scheduleRender({ charts: true });
  }
  smoothInput.addEventListener("input", () => {
    const w = Number(smoothInput.value);
    curveView.smoothing = Number.isFinite(w) ? Math.min(MAX_SMOOTHING, Math.max(0, w)) : 0;
    curveChanged();
  });
  logInput.addEventListener("change", () => {
    curveView.logY = logInput.checked;
    curveChanged();
  });
  xSelect.addEventListener("change", () => {
    curveView.xAxis = (X_AXES as string[]).includes(xSelect.value) ? (xSelect.value as XAxis) : "samples";
    curveChanged();
  });
  function makeChart(split: "train" | "eval", label: string, xLabel: string, preferred: string): Chart {
    const select = h("select", { "data-testid": `rf-metric-${split}` });
    const div = h("div", { class: "rf-chart-plot", "data-testid": `rf-chart-${split}` });
    const waiting = h("div", { class: "rf-chart-waiting", "data-testid": `rf-waiting-${split}` });
    const xText = h("span", { text: `vs ${xLabel}` });
    const head = h("div", { class: "rf-chart-head", title: "drag to zoom (a flat drag: x only, a tall one: y only); double-click, or Escape on the focused chart, to zoom out" },
      [h("span", { text: label }), " ", select, " ", xText]);
    chartsRow.append(h("div", { class: "rf-chart" }, [head, h("div", { class: "rf-chart-body" }, [div, waiting])]));
    const plot = new CanvasChart(div, {
      xLabel,
      // An eval curve has a point per chunk: averaging a few points misplaces each of them.
      smooths: split === "train",
      lowerFirst: (metric) => lowerIsBetter(metric),
      // A zoomed range redraws at full resolution inside it (planChart resets on a new range).
      onZoom: (range: Range | null) => {
        chart.book.range = range;
        chart.dirty = true;
        scheduleRender({ charts: true });
      },
      onHover: (id: number | null) => {
        runTable.highlight(id);
      },
    });
    const chart: Chart = {
      book: createChartBook(split, null), div, waiting, select, xLabel, xText, plot, options: [], preferred,
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
      persistPrefs();
      scheduleRender({ charts: true, table: true });
    });
    return chart;
  }
  charts.push(makeChart("train", "train", "samples seen", "loss"));
  charts.push(makeChart("eval", "eval", "samples seen", "eval_loss"));
  const evalChart = charts[1];

  // --- run table (./tableview.ts), and what it shares with the charts --------------------------
  const focusOn: Focus = {
    hover: null, pinned: new Set(), hiddenRuns: new Set(), hide: { stopped: false, pruned: false, deleted: false },
  };
  const { pinned, hiddenRuns, hide } = focusOn;
  const runTable = createRunTable({
    state, client, focus: focusOn,
    metric: () => evalChart.book.metric,
    disconnected: () => disconnected,
    scheduleRender: (what) => scheduleRender(what),
    emphasize: () => emphasizeAll(),
    hiddenChanged: () => {
      for (const c of charts) updateSelect(c);
      emphasizeAll();
      renderLegend();
    },
    persistPrefs: () => persistPrefs(),
    say: (text, kind) => say(text, kind),
    requestPull: () => requestPull(),
    openClone: (runId) => void cloneEditor.open(runId),
    showTraceback: (runId) => void traceback.show(runId),
  });
  root.append(runTable.filterBox, runTable.wrap);
  const messages = h("div", { class: "rf-messages", "data-testid": "rf-messages" });
  root.append(messages);

  // --- clone editor, traceback, time split (views of their own) --------------------------------
  const cloneEditor = createCloneEditor({
    client, knobColumns: () => knobColumns(state), say, requestPull: () => requestPull(), isDisposed: () => disposed,
    disconnected: () => disconnected !== null,
  });
  const traceback = createTracebackView(client);
  const timeSplit = createTimeSplitView({ requestDraw: () => scheduleRender({ time: true }), noteCall: (w) => noteCall(w) });
  root.append(cloneEditor.el, traceback.el, timeSplit.details);

  // --- Ray workers: lost-worker notices above the filters, the chunk timeline ----------
  // Both live in workers.ts / timeline.ts; renderHeader (run for every applied batch) calls
  // renderWorkers, and the timeline keeps its own redraw cadence, drawing nothing while folded.
  const workerNotices = createWorkerNotices();
  runTable.filterBox.before(workerNotices.el);
  const timeline = createTimelineView();
  root.append(timeline.details);
  // Knobs -> metric: a point's hover lights up the run as hovering its row does; a click pins it
  // as a click on its row does (the row shows it pinned, the curves stay emphasized).
  const knobView = createKnobView({
    onHover: (id) => {
      focusOn.hover = id;
      runTable.highlight(id);
      emphasizeAll();
    },
    onPick: (id) => {
      if (pinned.has(id)) pinned.delete(id);
      else pinned.add(id);
      const row = runTable.wrap.querySelector(`tr[data-run-id="${id}"]`);
      row?.classList.toggle("rf-pinned", pinned.has(id));
      emphasizeAll();
      knobView.update(state, pinned);
    },
  });
  root.append(knobView.details);
  function renderWorkers(): void {
    workerNotices.render(state);
    timeline.update(state);
  }
  // --- end of Ray workers ------------------------------------------------------------------------

  // --- messages -------------------------------------------------------------------------------
  // An answer ("stop run 3: accepted") goes stale once the run has moved on: it clears itself after
  // a while; an error stays until the next message.
  let sayTimer: ReturnType<typeof setTimeout> | undefined;
  function say(text: string, kind: "ok" | "error" | "note" = "note"): void {
    messages.textContent = text;
    messages.className = `rf-messages ${kind === "error" ? "rf-error" : kind === "ok" ? "rf-ok" : "rf-note"}`;
    if (sayTimer !== undefined) clearTimeout(sayTimer);
    sayTimer = kind === "error" ? undefined : setTimeout(() => {
      sayTimer = undefined;
      if (messages.textContent === text) messages.textContent = "";
    }, MESSAGE_CLEAR_MS);
  }

  // --- rendering, coalesced into one animation frame --------------------------------------------
  let pendingRender = { charts: false, table: false, time: false, header: false };
  // What the frame being rendered changed in the charts, for the update timings.
  let callLog: string[] = [];
  const noteCall = (what: string) => callLog.push(what);
  let renderScheduled = false;
  function scheduleRender(what: Partial<typeof pendingRender>): void {
    pendingRender = {
      charts: pendingRender.charts || !!what.charts,
      table: pendingRender.table || !!what.table,
      time: pendingRender.time || !!what.time,
      header: pendingRender.header || !!what.header,
    };
    if (renderScheduled || disposed) return;
    renderScheduled = true;
    const run = () => {
      renderScheduled = false;
      if (disposed) return;
      const what = pendingRender;
      pendingRender = { charts: false, table: false, time: false, header: false };
      const renderStart = performance.now();
      const frameCalls: string[] = [];
      callLog = frameCalls;
      try {
        if (what.header) renderHeader();
        if (what.charts) renderCharts();
        if (what.table) runTable.render();
        // In the same frame as the curves and the table: the bars are a few divs a run, rebuilt at
        // most every timeSplitInterval. (Deferring it to a frame without chart or table work, as
        // for Plotly, starved it while events streamed in.)
        if (what.time) timeSplit.render(state);
      } catch (err) {
        say(`panel render error: ${String(err)}`, "error");
      }
      if (update !== null) {
        // The canvas draws synchronously: when render returns, the charts are drawn.
        const u = update;
        update = null;
        const end = performance.now();
        recordTiming({
          events: u.events, runs: state.runs.size, ingestMs: u.ingestMs, renderMs: end - renderStart,
          workMs: u.ingestMs + (end - renderStart), wallMs: end - u.start, calls: frameCalls,
        });
      }
    };
    // Background tabs throttle requestAnimationFrame to nothing; a timeout keeps state current.
    if (typeof requestAnimationFrame === "function" && document.visibilityState === "visible") {
      requestAnimationFrame(run);
    } else {
      setTimeout(run, 50);
    }
  }

  function renderHeader(): void {
    title.textContent = state.experiment ? `RapidFire · ${state.experiment}` : "RapidFire";
    counts.replaceChildren(
      ...headerCounts(state).map(([text, s]) => {
        const span = h("span", { class: "rf-count", text });
        span.style.background = STATUS_COLORS[s];
        const title = headerCountTitle(state, s);
        if (title) span.title = title;
        return span;
      }),
    );
    renderWorkers();
    const asked = suggestedRuns(state);
    if (asked.length) {
      const span = h("span", { class: "rf-count rf-count-suggest", "data-testid": "rf-suggested-count",
        text: `${asked.length} suggested to stop` });
      span.title = `the pruner suggests stopping run${asked.length > 1 ? "s" : ""} ${asked.join(", ")}: Confirm or Ignore on each row`;
      counts.append(span);
    }
    if (disconnected !== null) {
      live.textContent = "disconnected";
      return;
    }
    live.textContent = `${state.ended ? "ended" : "live"} · seq ${state.lastSeq}${state.knownSeq > state.lastSeq ? ` / ${state.knownSeq}` : ""}`;
    if (disconnected === null && live.title === "") {
      live.title = "seq: how many events of the experiment's log this panel has read";
    }
  }

  function updateSelect(chart: Chart): void {
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
    const allHidden = !empty && withData.every((r) => !runShown(r, hide) || hiddenRuns.has(r.id));
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
  function applyPlan(chart: Chart, plan: ChartPlan): void {
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
  function flushChart(chart: Chart): void {
    if (!chart.dirty) return;
    chart.dirty = false;
    noteCall(`${chart.book.split}:draw`);
    try {
      chart.plot.setXZoom(chart.book.drawnRange);
      chart.plot.setData(drawSeries(chart.traces, chart.styles), chart.rungs, chart.book.drawnMetric ?? "");
      chart.plot.draw();
    } catch (err) {
      // Whatever failed, the next render redraws this chart from the state.
      chart.book.drawnMetric = null;
      chart.emphasisKey = "";
      chart.rungKey = "";
      say(`chart error: ${String(err)}`, "error");
    }
  }

  // --- emphasis: hover a row to highlight its curves, click to pin, swatch to hide, filters ------

  function emphasize(chart: Chart): void {
    const order = chart.book.order;
    if (chart.book.drawnMetric === null) return;
    const focus = new Set(pinned);
    if (focusOn.hover !== null) focus.add(focusOn.hover);
    // Eval markers (one per chunk) of dozens of runs pile into a solid band: past a few runs only
    // the hovered or pinned runs show theirs; the curves still answer hover at every point.
    const styles = seriesStyles(state, order, chart.book.split, focus, hiddenRuns, hide);
    const key = JSON.stringify(styles);
    if (key === chart.emphasisKey) return;
    chart.emphasisKey = key;
    chart.styles = styles;
    noteCall(`${chart.book.split}:emphasis`);
    chart.dirty = true;
  }

  /**
   * Mark where each shown pruned run was cut: a cross at its last eval point, the pruner's reason
   * on hover.
   */
  function markRungs(chart: Chart): void {
    if (chart.book.drawnMetric === null) return;
    const rungs = pruneRungs(state, chart.book.split, chart.book.drawnMetric).filter((r) => {
      const run = state.runs.get(r.runId);
      return !!run && runShown(run, hide) && !hiddenRuns.has(r.runId);
    });
    const key = JSON.stringify(rungs);
    if (key === chart.rungKey) return;
    chart.rungKey = key;
    chart.rungs = rungs;
    noteCall(`${chart.book.split}:rungs`);
    chart.dirty = true;
  }

  function emphasizeAll(): void {
    for (const c of charts) {
      emphasize(c);
      markRungs(c);
      flushChart(c);
    }
  }

  function renderCharts(): void {
    for (const chart of charts) {
      updateSelect(chart);
      const plan = planChart(state, chart.book);
      if (!planIsEmpty(plan)) applyPlan(chart, plan);
    }
    emphasizeAll();
    renderLegend();
    knobView.update(state, pinned);
  }

  /**
   * The colour key: one entry per run with a curve, in its colour and dash, by its short name.
   * Hovering an entry emphasizes the run as hovering its row does; runs hidden by their swatch
   * in the table are struck through.
   */
  function renderLegend(): void {
    const runs = [...state.runs.values()]
      .filter((r) => Object.keys(r.train).length > 0 || Object.keys(r.eval).length > 0)
      .sort((a, b) => a.id - b.id);
    const entries = runs.map((r) => [r.id, traceName(r), hiddenRuns.has(r.id), r.note, runTitle(r)] as const);
    const key = JSON.stringify(entries);
    if (key === legendKey) return;
    legendKey = key;
    legend.replaceChildren(...entries.map(([id, name, hidden, note, full]) => {
      const swatch = h("span", { class: "rf-legend-swatch" });
      swatch.style.background = runColor(id);
      const item = h("span", { class: `rf-legend-item${hidden ? " rf-legend-hidden" : ""}`, "data-run": String(id),
        "data-testid": "rf-legend-item",
        title: `${full}: hover to emphasize its curves, click to write a note on it${hidden ? " (hidden by its swatch in the table)" : ""}${note ? `\nnote: ${note}` : ""}` },
      [swatch, name, ...(note ? [h("span", { class: "rf-legend-note", text: " ✎", title: note })] : [])]);
      item.addEventListener("mouseenter", () => {
        focusOn.hover = id;
        runTable.highlight(id);
        emphasizeAll();
      });
      item.addEventListener("mouseleave", () => {
        if (focusOn.hover === id) focusOn.hover = null;
        runTable.highlight(null);
        emphasizeAll();
      });
      item.addEventListener("click", () => openNote(id));
      return item;
    }));
  }

  /** The kernel side is gone: grey the panel, say so once, and stop sending. */
  function disconnect(why: string): void {
    if (disconnected !== null || disposed) return;
    disconnected = why;
    clearInterval(timer);
    root.classList.add("rf-disconnected");
    // Re-running the run_fit cell as it is starts a new experiment from scratch; after a restart
    // what continues the runs is resume=True with this experiment's folder, so the banner names
    // both, as code to copy.
    banner.replaceChildren(
      `${why}: this panel no longer controls anything. If the kernel still runs, `,
      h("code", { text: "%rapidfire panel" }), " shows a live one. After a restart, ",
      h("code", { text: resumeCall(state.experiment, state.path) }),
      " and the same run_fit(...) continue the unfinished runs from their last chunk boundary "
      + "(re-running the cell as it is starts a new experiment from scratch).",
    );
    banner.style.display = "";
    if (!messages.classList.contains("rf-error")) messages.textContent = "";
    live.textContent = "disconnected";
    live.title = why;
    // the counts are the last ones seen, not what trains now
    counts.title = "as last seen before the kernel went away; nothing here is live";
    // Close buttons stay: a box left open on a dead panel must still go away.
    for (const b of root.querySelectorAll<HTMLButtonElement>("button:not([data-role=close])")) b.disabled = true;
    scheduleRender({ header: true, table: true });
  }

  // --- protocol: push, pull, snapshot -----------------------------------------------------------
  let lastPushAt = 0;
  let update: { start: number; ingestMs: number; events: number } | null = null;
  const timings: UpdateTiming[] = [];
  // The browser test reads these off the panel element (performance.now() around each update).
  (root as unknown as { rfTimings: UpdateTiming[] }).rfTimings = timings;
  function recordTiming(t: UpdateTiming): void {
    timings.push(t);
    if (timings.length > 500) timings.splice(0, timings.length - 500);
  }
  function absorb(events: unknown, lastSeq: unknown): void {
    const t0 = performance.now();
    noteKnownSeq(state, lastSeq);
    const r = ingest(state, events);
    restorePrefs();
    if (r.applied > 0) {
      if (update === null) update = { start: t0, ingestMs: 0, events: 0 };
      update.ingestMs += performance.now() - t0;
      update.events += r.applied;
    }
    scheduleRender({
      header: true,
      charts: r.applied > 0,
      table: r.changedRuns.size > 0 || r.newMetrics,
      time: r.timeChanged,
    });
  }

  // --- what the user set up, remembered per experiment across re-renders -------------------------
  let prefsAt: string | null = null;
  function persistPrefs(): void {
    const prefs: ViewPrefs = {
      hide: { ...hide }, sort: runTable.sortKey(), groupOpen: runTable.groupOpen(),
      metrics: { train: charts[0].preferred, eval: charts[1].preferred },
      curves: { ...curveView },
    };
    savePrefs(prefsAt, prefs);
  }
  /** Once the experiment is known (snapshot or first event), bring back what was set up for it. */
  function restorePrefs(): void {
    if (prefsAt !== null) return;
    prefsAt = prefsKey(state.path, state.experiment);
    const prefs = loadPrefs(prefsAt);
    if (prefs === null) return;
    Object.assign(hide, prefs.hide);
    runTable.restore(prefs.sort, prefs.groupOpen);
    for (const [i, m] of [prefs.metrics.train, prefs.metrics.eval].entries()) {
      if (m === null) continue;
      charts[i].preferred = m;
      charts[i].book.metric = m;
    }
    Object.assign(curveView, prefs.curves);
    applyCurveView();
    scheduleRender({ charts: true, table: true });
  }

  let pullAgain = false;
  function requestPull(): void {
    const now = Date.now();
    if (!client.canPull(now)) {
      pullAgain = true;
      return;
    }
    pullAgain = false;
    void client.pull(state.lastSeq, now).then((reply: Reply) => {
      if (disposed || disconnected !== null) return;
      if (reply.ok) {
        if ("on_device" in reply && noteOnDevice(state, reply.on_device)) scheduleRender({ header: true, table: true });
        if ("queued" in reply && noteQueued(state, reply.queued)) scheduleRender({ header: true, table: true });
        absorb(reply.events, reply.last_seq);
        live.title = "";
        // Batches are capped in size: keep pulling until caught up.
        if (reply.more === true || needsPull(state) || pullAgain) requestPull();
      } else {
        live.textContent = "waiting for the kernel…";
        live.title = reply.error ?? "";
      }
    });
  }

  const onCustom = (msg: unknown) => {
    if (disposed || !msg || typeof msg !== "object") return;
    const data = msg as Record<string, unknown>;
    if (data.type === "events") {
      lastPushAt = Date.now();
      if ("queued" in data && noteQueued(state, data.queued)) scheduleRender({ table: true });
      absorb(data.events, data.last_seq);
      if (needsPull(state)) requestPull();
    } else if (data.type === "reply") {
      client.handleReply(data as unknown as Reply);
      // Another view's pull reply carries events too; applying them is idempotent.
      if (Array.isArray(data.events)) absorb(data.events, data.last_seq);
    }
  };
  const onSnapshot = () => {
    const before = state.onDevice;
    const queuedBefore = state.queued;
    applySnapshot(state, m.get("snapshot"));
    // The badges name the run on the device and queued ops: either change repaints the rows.
    scheduleRender({ header: true, table: state.onDevice !== before || state.queued !== queuedBefore });
    if (needsPull(state)) requestPull();
  };
  m.on("msg:custom", onCustom);
  m.on("change:snapshot", onSnapshot);
  // ipywidgets' model says when its comm closes (the kernel closed the widget or went away).
  const onClosed = () => disconnect("the kernel closed this panel's connection (kernel restarted or shut down)");
  const events = m as unknown as { on(name: string, cb: () => void): void; off(name: string, cb: () => void): void };
  events.on("comm:close", onClosed);
  applySnapshot(state, m.get("snapshot"));
  restorePrefs();
  renderHeader();
  scheduleRender({ charts: true });
  requestPull();

  timer = setInterval(() => {
    const now = Date.now();
    if (needsPull(state) || now - lastPushAt > PUSH_SILENCE_MS) requestPull();
  }, PULL_INTERVAL_MS);

  // Notebook panes resize on their own, not only with the window.
  const resizeObserver =
    typeof ResizeObserver === "function"
      ? new ResizeObserver((entries) => {
          for (const e of entries) {
            const c = charts.find((ch) => ch.div === e.target);
            const box = e.contentRect;
            if (c && box.width > 0 && c.plot.resize(box.width, box.height)) c.plot.draw();
          }
        })
      : null;
  for (const c of charts) resizeObserver?.observe(c.div);

  return () => {
    disposed = true;
    clearInterval(timer);
    timeline.dispose();
    knobView.dispose();
    runTable.dispose();
    m.off("msg:custom", onCustom);
    m.off("change:snapshot", onSnapshot);
    events.off("comm:close", onClosed);
    resizeObserver?.disconnect();
    client.dispose();
    for (const c of charts) c.plot.destroy();
    timeSplit.dispose();
    if (sayTimer !== undefined) clearTimeout(sayTimer);
    el.replaceChildren();
  };
}

export default { render };
