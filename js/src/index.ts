/**
 * The rapidfire_nb control panel: an anywidget ESM view (`render({model, el})`, returns its cleanup).
 *
 * Works the same in JupyterLab, Notebook 7, VS Code and Colab because it uses only the plain
 * anywidget model API (`model.get/on/off/send`). The state lives in ./state.ts (tested alone);
 * this file turns state changes into DOM updates and canvas draws: each chart keeps its own copy
 * of its traces, changes them in place, and draws a frame's changes in one canvas pass
 * (./canvaschart.ts). The boxes below the table are views of their own (./cloneview.ts,
 * ./tracebackview.ts, ./timesplit.ts, ./timeline.ts), as are the worker notices (./workers.ts).
 */
import type { AnyModel, RenderProps } from "@anywidget/types";
import { Client, type Reply } from "./client";
import { CSS } from "./style";
import { h } from "./dom";
import { createCloneEditor } from "./cloneview";
import { createTracebackView } from "./tracebackview";
import { createTimeSplitView } from "./timesplit";
import { suggestedRuns, suggestionOpen } from "./suggest";
import { createWorkerNotices, hasWorkers, workerCell } from "./workers";
import { createTimelineView } from "./timeline";
import { drawSeries, seriesStyles } from "./scale";
import { CanvasChart, type Range, type RungMark } from "./canvaschart";
import { loadPrefs, prefsKey, savePrefs, type ViewPrefs } from "./viewprefs";
import {
  applySnapshot,
  createState,
  ingest,
  needsPull,
  noteKnownSeq,
  noteOnDevice,
  noteQueued,
  has,
  lowerIsBetter,
  type PanelState,
  type RunState,
} from "./state";
import { runKey, STATUS_COLORS } from "./palette";
import {
  fmtNumber,
  formatKnobValue,
  readableKnob,
  chunkText,
  progressFraction,
  stepText,
  readableMetric,
  ownEpoch,
  dataStartText,
} from "./format";
import {
  headerCounts,
  headerCountTitle,
  knobColumns,
  legalOps,
  runShown,
  isCollapsible,
  isPruned,
  effectiveSort,
  sortRuns,
  statusBadge,
  heldOrder,
  type SortColumn,
  type SortKey,
  type StatusFilters,
} from "./table";
import {
  createChartBook,
  defaultMetric,
  waitingText,
  planChart,
  planIsEmpty,
  pruneRungs,
  type ChartBook,
  type ChartPlan,
  type TraceSpec,
} from "./chartplan";

type Model = AnyModel<{ snapshot: Record<string, unknown> }>;
type SimpleOp = "stop" | "resume" | "delete" | "confirm_suggestion" | "ignore_suggestion";
const OP_WORDS: Record<SimpleOp, string> = {
  stop: "stop", resume: "resume", delete: "delete",
  confirm_suggestion: "confirm the pruner's stop of", ignore_suggestion: "ignore the pruner's suggestion for",
};

const PULL_INTERVAL_MS = 1000;
/**
 * Pull anyway when no push arrived for this long (Colab drops background-thread pushes). A pull
 * is also how the view learns that the kernel went away (its send fails), so this bounds how long
 * a panel whose kernel restarted can still look live: about two seconds.
 */
const PUSH_SILENCE_MS = 1000;
/** A click with no reply after this long says so (the kernel answers between cells only). */
const OP_SLOW_MS = 4000;
/** A confirming second click on Delete sooner than this is one double click, not a confirmation. */
const DELETE_CONFIRM_MIN_MS = 400;

interface Chart {
  book: ChartBook;
  div: HTMLDivElement;
  waiting: HTMLDivElement;
  select: HTMLSelectElement;
  xLabel: string;
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
  const chartsRow = h("div", { class: "rf-charts" });
  root.append(chartsRow);
  function makeChart(split: "train" | "eval", label: string, xLabel: string, preferred: string): Chart {
    const select = h("select", { "data-testid": `rf-metric-${split}` });
    const div = h("div", { class: "rf-chart-plot", "data-testid": `rf-chart-${split}` });
    const waiting = h("div", { class: "rf-chart-waiting", "data-testid": `rf-waiting-${split}` });
    const head = h("div", { class: "rf-chart-head", title: "drag to zoom (a flat drag: x only, a tall one: y only); double-click, or Escape on the focused chart, to zoom out" },
      [h("span", { text: label }), " ", select, " ", h("span", { text: `vs ${xLabel}` })]);
    chartsRow.append(h("div", { class: "rf-chart" }, [head, h("div", { class: "rf-chart-body" }, [div, waiting])]));
    const plot = new CanvasChart(div, {
      xLabel,
      // A zoomed range redraws at full resolution inside it (planChart resets on a new range).
      onZoom: (range: Range | null) => {
        chart.book.range = range;
        chart.dirty = true;
        scheduleRender({ charts: true });
      },
      onHover: (id: number | null) => {
        for (const [rid, row] of rows) row.tr.classList.toggle("rf-hot", rid === id);
      },
    });
    const chart: Chart = {
      book: createChartBook(split, null), div, waiting, select, xLabel, plot, options: [], preferred,
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

  // --- run table --------------------------------------------------------------------------------
  const table = h("table", { class: "rf-table", "data-testid": "rf-runs" });
  const thead = h("thead");
  const tbody = h("tbody");
  table.append(thead, tbody);
  const filterBox = h("div", { class: "rf-filters", "data-testid": "rf-filters" }, ["hide:"]);
  const filterBoxes = new Map<keyof StatusFilters, HTMLInputElement>();
  for (const s of ["stopped", "pruned", "deleted"] as (keyof StatusFilters)[]) {
    const box = h("input", { type: "checkbox", "data-filter": s });
    filterBoxes.set(s, box);
    box.addEventListener("change", () => {
      hide[s] = box.checked;
      persistPrefs();
      scheduleRender({ charts: true, table: true });
    });
    filterBox.append(h("label", { title: `hide ${s} runs in the charts and the table` }, [box, ` ${s}`]));
  }
  const hiddenNote = h("span", { class: "rf-note", "data-testid": "rf-hidden-note" });
  filterBox.append(hiddenNote);
  const tableWrap = h("div", { class: "rf-table-wrap" }, [table]);
  root.append(filterBox, tableWrap);
  // The auto sort waits while the pointer is over the table; leaving it applies the order.
  let pointerInTable = false;
  tableWrap.addEventListener("mouseenter", () => {
    pointerInTable = true;
  });
  tableWrap.addEventListener("mouseleave", () => {
    pointerInTable = false;
    scheduleRender({ table: true });
  });
  const messages = h("div", { class: "rf-messages", "data-testid": "rf-messages" });
  root.append(messages);

  // --- clone editor, traceback, time split (views of their own) --------------------------------
  const cloneEditor = createCloneEditor({
    client, knobColumns: () => knobColumns(state), say, requestPull: () => requestPull(), isDisposed: () => disposed,
  });
  const traceback = createTracebackView(client);
  const timeSplit = createTimeSplitView({ requestDraw: () => scheduleRender({ time: true }), noteCall: (w) => noteCall(w) });
  root.append(cloneEditor.el, traceback.el, timeSplit.details);

  // --- Ray workers: lost-worker notices above the filters, the chunk timeline ----------
  // Both live in workers.ts / timeline.ts; renderHeader (run for every applied batch) calls
  // renderWorkers, and the timeline keeps its own redraw cadence, drawing nothing while folded.
  const workerNotices = createWorkerNotices();
  filterBox.before(workerNotices.el);
  const timeline = createTimelineView();
  root.append(timeline.details);
  function renderWorkers(): void {
    workerNotices.render(state);
    timeline.update(state);
  }
  // --- end of Ray workers ------------------------------------------------------------------------

  // --- messages -------------------------------------------------------------------------------
  function say(text: string, kind: "ok" | "error" | "note" = "note"): void {
    messages.textContent = text;
    messages.className = `rf-messages ${kind === "error" ? "rf-error" : kind === "ok" ? "rf-ok" : "rf-note"}`;
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
        if (what.table) renderTable();
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
  let hoverRun: number | null = null;
  const pinned = new Set<number>();
  const hiddenRuns = new Set<number>();
  const hide: StatusFilters = { stopped: false, pruned: false, deleted: false };

  function emphasize(chart: Chart): void {
    const order = chart.book.order;
    if (chart.book.drawnMetric === null) return;
    const focus = new Set(pinned);
    if (hoverRun !== null) focus.add(hoverRun);
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
  }

  // --- the run table, keyed by run id so buttons stay put while rows update ------------------
  // Id, status and the buttons come first so that they stay in view in a narrow notebook; then
  // only the knobs that differ between runs, values clipped with the full text on hover.
  interface Row {
    tr: HTMLTableRowElement;
    status: HTMLSpanElement;
    /** "▶ on device" beside the badge of the run training now. */
    device: HTMLSpanElement;
    knobCells: HTMLSpanElement[];
    progressBar: HTMLSpanElement;
    progressText: HTMLSpanElement;
    chunkText: HTMLDivElement;
    trainLoss: HTMLTableCellElement;
    latest: HTMLSpanElement;
    best: HTMLDivElement;
    parent: HTMLTableCellElement | null;
    worker: HTMLTableCellElement | null;
    note: HTMLDivElement;
    /** pruner_mode="suggest": the pruner's reason with Confirm / Ignore, while unanswered. */
    suggestion: HTMLDivElement;
    suggestionText: HTMLSpanElement;
    answers: Record<"confirm_suggestion" | "ignore_suggestion", HTMLButtonElement>;
    buttons: Record<"stop" | "resume" | "delete" | "clone" | "traceback", HTMLButtonElement>;
    busy: boolean;
  }
  const rows = new Map<number, Row>();
  const deleteArmed = new Map<number, { at: number; timer: ReturnType<typeof setTimeout> }>();
  let columnsKey = "";
  let rowColumnsKey = "";
  let sortKey: SortKey = { column: "auto", descending: false };
  const sortHeads = new Map<SortColumn, HTMLTableCellElement>();
  let groupOpen = false;
  const groupRow = h("tr", { class: "rf-group-row", "data-testid": "rf-group" });
  const groupCell = h("td");
  groupRow.append(groupCell);
  groupRow.addEventListener("click", () => {
    groupOpen = !groupOpen;
    persistPrefs();
    scheduleRender({ table: true });
  });
  let shownOrder = "";
  let shownIds: (number | "group")[] = [];
  // A header click is a request to reorder now, pointer over the table or not.
  let reorderNow = false;

  function headerClicked(column: SortColumn): void {
    const metric = evalChart.book.metric;
    const current = effectiveSort(state, sortKey, metric);
    // First click: the column's natural "best first" order; a second click reverses it.
    const natural = column === "eval" ? metric !== null && !lowerIsBetter(metric) : column === "progress";
    sortKey = current.column === column ? { column, descending: !current.descending } : { column, descending: natural };
    persistPrefs();
    reorderNow = true;
    scheduleRender({ table: true });
  }

  function renderTable(): void {
    const knobs = knobColumns(state);
    const metric = evalChart.book.metric;
    const lineage = [...state.runs.values()].some((r) => r.parent !== null);
    const workers = hasWorkers(state);
    const key = JSON.stringify([knobs, metric, lineage, workers]);
    // The eval metric only names a header: its first value must not rebuild the rows, or the
    // button under the pointer is replaced between press and release.
    const rowsKey = JSON.stringify([knobs, lineage, workers]);
    if (key !== columnsKey) {
      columnsKey = key;
      const heads: [string, string, SortColumn | null][] = [
        // What a user steers by comes first (id, status, buttons, the eval metric), so it stays
        // in view however narrow the notebook; the knobs and the rest follow.
        ["run", "", "id"], ["status", "", "status"], ["", "Stop · Resume · Delete · Clone", null],
        [metric ? readableMetric(metric) : "eval", `latest ${metric ?? "eval metric"} (and the best so far); sorted by the best`, "eval"],
        ...knobs.map((k): [string, string, null] => [readableKnob(k), k, null]),
        ["progress", "the run's own optimizer steps and epochs, and the chunk of data it trained last", "progress"],
        ...(workers ? [["worker", "the Ray worker that trained the run's last chunk", null] as [string, string, null]] : []),
        ["train loss", "latest training loss", "loss"],
        ...(lineage ? [["parent", "the run this one was cloned from", null] as [string, string, null]] : []),
      ];
      sortHeads.clear();
      thead.replaceChildren(h("tr", {}, heads.map(([t, title, col]) => {
        const th = h("th", title ? { text: t, title } : { text: t });
        if (col !== null) {
          th.classList.add("rf-sortable");
          th.dataset.sort = col;
          th.title = `${title ? `${title}. ` : ""}Click to sort`;
          th.addEventListener("click", () => headerClicked(col));
          sortHeads.set(col, th);
        }
        return th;
      })));
      groupCell.colSpan = heads.length;
      if (rowsKey !== rowColumnsKey) {
        rowColumnsKey = rowsKey;
        rows.clear();
        tbody.replaceChildren();
        shownOrder = "";
      }
    }
    const sort = effectiveSort(state, sortKey, metric);
    for (const [col, th] of sortHeads) {
      th.dataset.sorted = col === sort.column ? (sort.descending ? "desc" : "asc") : "";
    }
    const all = [...state.runs.values()];
    const shown = all.filter((r) => runShown(r, hide));
    const main = sortRuns(shown.filter((r) => !isCollapsible(r)), sort, metric);
    const folded = shown.filter((r) => isCollapsible(r)).sort((a, b) => a.id - b.id);
    for (const run of all) {
      let row = rows.get(run.id);
      if (!row) {
        row = makeRow(run, knobs, lineage, workers);
        rows.set(run.id, row);
      }
      updateRow(row, run, knobs, metric);
    }
    const nPruned = folded.filter((r) => isPruned(r)).length;
    const nDeleted = folded.length - nPruned;
    const parts = [nPruned ? `${nPruned} pruned` : "", nDeleted ? `${nDeleted} deleted` : ""].filter(Boolean).join(" · ");
    groupCell.textContent = `${groupOpen ? "▾" : "▸"} ${parts} (click to ${groupOpen ? "fold" : "show"})`;
    const hold = !reorderNow && (pointerInTable || deleteArmed.size > 0);
    reorderNow = false;
    const liveOrder = heldOrder(
      shownIds.filter((id): id is number => id !== "group" && main.includes(id)), main, hold,
    );
    const order: (number | "group")[] = [
      ...liveOrder, ...(folded.length ? ["group" as const] : []), ...(groupOpen ? folded.map((r) => r.id) : []),
    ];
    const held = liveOrder.join(",") !== main.join(",");
    const orderKey = order.join(",");
    if (orderKey !== shownOrder) {
      shownOrder = orderKey;
      shownIds = order;
      tbody.replaceChildren(...order.map((id) => (id === "group" ? groupRow : rows.get(id as number)!.tr)));
      // A row taken out from under the pointer never gets its mouseleave.
      if (hoverRun !== null && !order.includes(hoverRun)) {
        hoverRun = null;
        emphasizeAll();
      }
    }
    const hiddenCount = all.length - shown.length;
    const hiddenText = hiddenCount ? `${hiddenCount} run${hiddenCount > 1 ? "s" : ""} hidden` : "";
    const heldText = held ? "order held while the pointer is on the table" : "";
    hiddenNote.textContent = [hiddenText, heldText].filter(Boolean).join(" · ");
  }

  function makeRow(run: RunState, knobs: string[], lineage: boolean, workers: boolean): Row {
    const tr = h("tr", { "data-run-id": String(run.id) });
    const swatch = h("span", {
      class: "rf-swatch", "data-testid": "rf-swatch",
      title: `run ${run.id}: click to hide or show its curves; click the row to pin them`,
    });
    const key = runKey(run.id);
    Object.assign(swatch.style, key.css);
    swatch.title = `${key.title}. Click to hide or show its curves; click the row to pin them`;
    swatch.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (hiddenRuns.has(run.id)) hiddenRuns.delete(run.id);
      else hiddenRuns.add(run.id);
      swatch.classList.toggle("rf-swatch-off", hiddenRuns.has(run.id));
      for (const c of charts) updateSelect(c);
      emphasizeAll();
    });
    tr.addEventListener("mouseenter", () => {
      hoverRun = run.id;
      emphasizeAll();
    });
    tr.addEventListener("mouseleave", () => {
      if (hoverRun === run.id) hoverRun = null;
      emphasizeAll();
    });
    tr.addEventListener("click", (ev) => {
      // Buttons and form fields in the row do their own thing.
      if ((ev.target as HTMLElement).closest("button, input, select, a")) return;
      if (pinned.has(run.id)) pinned.delete(run.id);
      else pinned.add(run.id);
      tr.classList.toggle("rf-pinned", pinned.has(run.id));
      emphasizeAll();
    });
    const status = h("span", { class: "rf-status", "data-testid": "rf-status" });
    const knobCells = knobs.map(() => h("span", { class: "rf-clip" }));
    const progressBar = h("span");
    const progressTextEl = h("span", { class: "rf-progress-text" });
    const chunkTextEl = h("div", { class: "rf-note" });
    const mk = (op: "stop" | "resume" | "delete" | "clone" | "traceback", label: string) =>
      h("button", { "data-op": op, title: `${label} run ${run.id}`, text: label });
    const buttons = {
      stop: mk("stop", "Stop"),
      resume: mk("resume", "Resume"),
      delete: mk("delete", "Delete"),
      clone: mk("clone", "Clone"),
      traceback: mk("traceback", "Traceback"),
    };
    buttons.delete.classList.add("rf-danger");
    const suggestionText = h("span", { class: "rf-suggest-text" });
    const answers = {
      confirm_suggestion: h("button", {
        "data-op": "confirm_suggestion", class: "rf-primary", text: "Confirm",
        title: `stop run ${run.id} as the pruner suggests`,
      }),
      ignore_suggestion: h("button", {
        "data-op": "ignore_suggestion", text: "Ignore",
        title: `keep training run ${run.id}; the pruner will not judge it again`,
      }),
    };
    const suggestion = h("div", { class: "rf-suggest", "data-testid": "rf-suggestion" },
      [h("span", { class: "rf-suggest-label", text: "pruner suggests stopping: " }), suggestionText,
        answers.confirm_suggestion, answers.ignore_suggestion]);
    suggestion.style.display = "none";
    const row: Row = {
      tr,
      status,
      device: h("span", { class: "rf-on-device", "data-testid": "rf-on-device", text: " ▶ on device" }),
      knobCells,
      progressBar,
      progressText: progressTextEl,
      chunkText: chunkTextEl,
      trainLoss: h("td", { class: "rf-num" }),
      latest: h("span", { "data-testid": "rf-latest" }),
      best: h("div", { class: "rf-note" }),
      parent: lineage ? h("td") : null,
      worker: workers ? h("td", { "data-testid": "rf-worker" }) : null,
      note: h("div", { class: "rf-note rf-row-note" }),
      suggestion,
      suggestionText,
      answers,
      buttons,
      busy: false,
    };
    buttons.stop.addEventListener("click", () => simpleOp(row, run.id, "stop"));
    buttons.resume.addEventListener("click", () => simpleOp(row, run.id, "resume"));
    buttons.delete.addEventListener("click", () => deleteClicked(row, run.id));
    buttons.clone.addEventListener("click", () => void cloneEditor.open(run.id));
    buttons.traceback.addEventListener("click", () => void traceback.show(run.id));
    answers.confirm_suggestion.addEventListener("click", () => simpleOp(row, run.id, "confirm_suggestion"));
    answers.ignore_suggestion.addEventListener("click", () => simpleOp(row, run.id, "ignore_suggestion"));
    tr.append(
      h("td", { class: "rf-id" }, [swatch, `${run.id}`]),
      h("td", {}, [status, row.device]),
      h("td", {}, [h("span", { class: "rf-actions" }, Object.values(buttons)), row.note, suggestion]),
      h("td", { class: "rf-num", "data-testid": "rf-eval-cell" }, [row.latest, row.best]),
      ...knobCells.map((c) => h("td", { class: "rf-knob" }, [c])),
      h("td", {}, [h("span", { class: "rf-progress" }, [progressBar]), progressTextEl, chunkTextEl]),
      ...(row.worker ? [row.worker] : []),
      row.trainLoss,
      ...(row.parent ? [row.parent] : []),
    );
    return row;
  }

  function updateRow(row: Row, run: RunState, knobs: string[], metric: string | null): void {
    row.tr.dataset.status = run.status;
    const badge = statusBadge(run, state);
    row.status.textContent = badge.text;
    row.status.style.background = STATUS_COLORS[badge.status];
    row.status.classList.toggle("rf-queued", state.queued.has(run.id));
    row.device.style.display = badge.onDevice ? "" : "none";
    row.device.title = badge.onDevice ? "this run has the device now (runs train one chunk at a time)" : "";
    knobs.forEach((k, i) => {
      // A knob the run leaves at its default has no entry: show what the run does, not a blank.
      const epochs = k.endsWith("num_train_epochs") ? ownEpoch(run)?.epochs : undefined;
      const set = has(run.knobs, k);
      const text = set ? formatKnobValue(run.knobs[k]) : epochs !== undefined ? String(epochs) : "default";
      row.knobCells[i].textContent = text;
      row.knobCells[i].classList.toggle("rf-default", !set);
      row.knobCells[i].title = set ? `${k} = ${text}` : `${k} not set: the trainer's default${epochs !== undefined ? ` (${epochs})` : ""}`;
    });
    row.progressBar.style.width = `${(progressFraction(run) * 100).toFixed(1)}%`;
    row.progressText.textContent = stepText(run);
    row.chunkText.textContent = chunkText(run);
    row.chunkText.title = dataStartText(run);
    row.trainLoss.textContent = fmtNumber(has(run.latest, "loss") ? run.latest["loss"] : null);
    const latest = metric !== null && has(run.latest, metric) ? run.latest[metric] : null;
    row.latest.textContent = metric ? fmtNumber(latest) : "–";
    const best = metric !== null && has(run.best, metric) ? run.best[metric] : undefined;
    row.best.textContent = best !== undefined && best !== latest ? `best ${fmtNumber(best)}` : "";
    if (row.worker) {
      const cell = workerCell(state, run);
      row.worker.textContent = cell.text;
      row.worker.title = cell.title;
    }
    if (row.parent) row.parent.textContent = run.parent !== null ? `${run.parent}${run.warmStart ? " (warm)" : ""}` : "";
    const legal = legalOps(run.status, state.queued.get(run.id) ?? null);
    const off = disconnected !== null;
    row.buttons.stop.disabled = off || row.busy || !legal.stop;
    row.buttons.resume.disabled = off || row.busy || !legal.resume;
    row.buttons.delete.disabled = off || row.busy || !legal.delete;
    row.buttons.clone.disabled = off || !legal.clone;
    row.buttons.traceback.disabled = off;
    row.buttons.traceback.style.display = run.hasError ? "" : "none";
    const asked = suggestionOpen(run);
    row.suggestion.style.display = asked ? "" : "none";
    row.suggestionText.textContent = asked ? run.suggestion! : "";
    row.suggestion.title = asked ? run.suggestion! : "";
    row.answers.confirm_suggestion.disabled = off || row.busy;
    row.answers.ignore_suggestion.disabled = off || row.busy;
    row.tr.classList.toggle("rf-suggested", asked);
    const op = run.lastOp;
    const note = run.reason ?? (op && !op.accepted ? `${op.op} refused: ${op.reason ?? ""}` : "");
    row.note.textContent = note;
    row.note.title = note;
    row.note.style.display = note ? "" : "none";
    row.status.title = badge.title;
  }

  async function simpleOp(row: Row, runId: number, op: SimpleOp): Promise<void> {
    const words = OP_WORDS[op];
    if (disconnected !== null) {
      say(`${words} run ${runId}: not sent, ${disconnected}`, "error");
      return;
    }
    // A second click (a double click, or Stop then Resume before the first reply) would reach
    // the kernel before the next render disables the buttons: one op per row at a time.
    if (row.busy) return;
    row.busy = true;
    setRowButtonsBusy(row);
    scheduleRender({ table: true });
    say(`${words} run ${runId}…`);
    // The kernel answers a click only between cells: past a few seconds, say why it waits.
    const slow = setTimeout(() => {
      if (row.busy && disconnected === null) {
        say(`${words} run ${runId}: no reply from the kernel after ${OP_SLOW_MS / 1000} s; a cell is `
          + "probably running (clicks act once it finishes)", "error");
      }
    }, OP_SLOW_MS);
    const reply = await client.request({ type: "op", op, run_id: runId });
    clearTimeout(slow);
    row.busy = false;
    if (disconnected !== null) say(`${words} run ${runId}: not delivered, ${disconnected}`, "error");
    // Only a run training now waits for a boundary; the engine applies the rest on its next turn.
    else if (reply.ok) say(`${words} run ${runId}: accepted${(op === "stop" || op === "resume" || op === "delete") && state.runs.get(runId)?.status === "running" ? " (applies at its next chunk boundary)" : ""}`, "ok");
    else say(`${words} run ${runId}: ${reply.error}`, "error");
    if ("queued" in reply) noteQueued(state, reply.queued);
    scheduleRender({ table: true, header: true });
    if (disconnected === null) requestPull();
  }

  /** Disable the row's op buttons now, not at the next frame (the render keeps them so). */
  function setRowButtonsBusy(row: Row): void {
    row.buttons.stop.disabled = true;
    row.buttons.resume.disabled = true;
    row.buttons.delete.disabled = true;
    row.answers.confirm_suggestion.disabled = true;
    row.answers.ignore_suggestion.disabled = true;
  }

  /** The kernel side is gone: grey the panel, say so once, and stop sending. */
  function disconnect(why: string): void {
    if (disconnected !== null || disposed) return;
    disconnected = why;
    clearInterval(timer);
    root.classList.add("rf-disconnected");
    // Re-running the run_fit cell as it is starts a new experiment from scratch; after a restart
    // what continues the runs is resume=True, so the banner names that with this experiment.
    const name = state.experiment !== null ? JSON.stringify(state.experiment) : "NAME";
    banner.textContent = `${why}: this panel no longer controls anything. If the kernel still runs, `
      + `\`%rapidfire panel\` shows a live one. After a restart, \`Experiment(${name}, resume=True)\` `
      + "and the same run_fit(...) continue the runs from their last chunk boundary (re-running the "
      + "cell as it is starts a new experiment from scratch).";
    banner.style.display = "";
    live.textContent = "disconnected";
    live.title = why;
    // the counts are the last ones seen, not what trains now
    counts.title = "as last seen before the kernel went away; nothing here is live";
    for (const b of root.querySelectorAll("button")) b.disabled = true;
    scheduleRender({ header: true, table: true });
  }

  function deleteClicked(row: Row, runId: number): void {
    // Two clicks instead of a modal confirm(), which blocks the whole notebook page.
    const armed = deleteArmed.get(runId);
    if (armed === undefined) {
      // The confirm belongs to this run's own button, and rows hold their places while it is
      // armed, so the second click lands on the same run.
      row.buttons.delete.textContent = "Confirm?";
      row.buttons.delete.title = `click again within 4 s to delete run ${runId}`;
      deleteArmed.set(runId, {
        at: performance.now(),
        timer: setTimeout(() => {
          deleteArmed.delete(runId);
          row.buttons.delete.textContent = "Delete";
          row.buttons.delete.title = `Delete run ${runId}`;
          scheduleRender({ table: true });
        }, 4000),
      });
      return;
    }
    // A double click is not a confirmation: the second click must come a moment later.
    if (performance.now() - armed.at < DELETE_CONFIRM_MIN_MS) return;
    clearTimeout(armed.timer);
    deleteArmed.delete(runId);
    row.buttons.delete.textContent = "Delete";
    row.buttons.delete.title = `Delete run ${runId}`;
    void simpleOp(row, runId, "delete");
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
      hide: { ...hide }, sort: { ...sortKey }, groupOpen,
      metrics: { train: charts[0].preferred, eval: charts[1].preferred },
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
    for (const [k, box] of filterBoxes) box.checked = hide[k];
    sortKey = { ...prefs.sort };
    groupOpen = prefs.groupOpen;
    for (const [i, m] of [prefs.metrics.train, prefs.metrics.eval].entries()) {
      if (m === null) continue;
      charts[i].preferred = m;
      charts[i].book.metric = m;
    }
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
    for (const a of deleteArmed.values()) clearTimeout(a.timer);
    m.off("msg:custom", onCustom);
    m.off("change:snapshot", onSnapshot);
    events.off("comm:close", onClosed);
    resizeObserver?.disconnect();
    client.dispose();
    for (const c of charts) c.plot.destroy();
    timeSplit.dispose();
    el.replaceChildren();
  };
}

export default { render };
