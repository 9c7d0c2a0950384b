/**
 * The rapidfire_nb control panel: an anywidget ESM view (`render({model, el})`, returns its cleanup).
 *
 * Works the same in JupyterLab, Notebook 7, VS Code and Colab because it uses only the plain
 * anywidget model API (`model.get/on/off/send`). The state lives in ./state.ts (tested alone);
 * this file turns state changes into DOM updates and Plotly calls, appending points to curves
 * with `Plotly.extendTraces` rather than redrawing them.
 */
import Plotly from "plotly.js-basic-dist-min";
import type { AnyModel, RenderProps } from "@anywidget/types";
import { Client, type Reply } from "./client";
import { CSS } from "./style";
import {
  applySnapshot,
  createChartBook,
  createState,
  defaultMetric,
  fmtNumber,
  fmtSeconds,
  formatKnobValue,
  ingest,
  cloneFormKnobs,
  headerCounts,
  knobChanges,
  knobColumns,
  readableKnob,
  waitingText,
  knobNamedIn,
  legalOps,
  needsPull,
  noteKnownSeq,
  planChart,
  planIsEmpty,
  chunkText,
  progressFraction,
  stepText,
  runColor,
  STATUS_COLORS,
  timeSplitFigure,
  type ChartBook,
  type ChartPlan,
  type PanelState,
  type RunState,
  type TraceSpec,
} from "./state";

type Model = AnyModel<{ snapshot: Record<string, unknown> }>;

const PULL_INTERVAL_MS = 1000;
/** Pull anyway when no push arrived for this long (Colab drops background-thread pushes). */
const PUSH_SILENCE_MS = 2500;
const TIME_SPLIT_REDRAW_MS = 2000;

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  children: (Node | string)[] = [],
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v);
  }
  for (const c of children) el.append(c);
  return el;
}

function themeLayout(root: HTMLElement): Record<string, unknown> {
  const color = getComputedStyle(root).color || "#1f2328";
  return {
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { color, size: 11 },
    // The legend sits above the plot, where it grows with the number of runs (plotly widens the
    // top margin for it) instead of running into the x-axis title below.
    margin: { l: 48, r: 8, t: 8, b: 36 },
    showlegend: true,
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom", font: { size: 10 } },
    hovermode: "closest",
    // From zero: a chart whose runs have one point each still gets a readable axis (0..x).
    xaxis: { gridcolor: "rgba(128,128,128,0.2)", zeroline: false, rangemode: "tozero" },
    yaxis: { gridcolor: "rgba(128,128,128,0.2)", zeroline: false },
  };
}

function toPlotlyTrace(t: TraceSpec, xLabel: string, metric: string): Record<string, unknown> {
  return {
    type: "scatter",
    mode: "lines+markers",
    name: t.name,
    x: t.x,
    y: t.y,
    line: { color: t.color, width: 2, dash: t.dash },
    marker: { color: t.color, size: 4 },
    hovertemplate: `${t.name}<br>${xLabel} %{x}<br>${metric} %{y:.5g}<extra></extra>`,
    meta: { runId: t.runId },
  };
}

interface Chart {
  book: ChartBook;
  div: HTMLDivElement;
  waiting: HTMLDivElement;
  select: HTMLSelectElement;
  xLabel: string;
  queue: Promise<unknown>;
  options: string[];
  /** The metric shown until the user picks another (when some run logs it). */
  preferred: string;
}

function render({ model, el }: RenderProps<{ snapshot: Record<string, unknown> }>): () => void {
  const m = model as Model;
  const state: PanelState = createState();
  const client = new Client(m);
  let disposed = false;

  const style = h("style", { text: CSS });
  const root = h("div", { class: "rf-panel", "data-testid": "rf-panel" });
  el.append(style, root);

  // --- header ---------------------------------------------------------------------------------
  const title = h("span", { class: "rf-title", text: "RapidFire" });
  const counts = h("span", { class: "rf-counts" });
  const live = h("span", { class: "rf-live", "data-testid": "rf-live", text: "connecting…" });
  root.append(h("div", { class: "rf-header" }, [title, counts, live]));

  // --- charts ---------------------------------------------------------------------------------
  const charts: Chart[] = [];
  const chartsRow = h("div", { class: "rf-charts" });
  root.append(chartsRow);
  function makeChart(split: "train" | "eval", label: string, xLabel: string, preferred: string): Chart {
    const select = h("select", { "data-testid": `rf-metric-${split}` });
    const div = h("div", { class: "rf-chart-plot", "data-testid": `rf-chart-${split}` });
    const waiting = h("div", { class: "rf-chart-waiting", "data-testid": `rf-waiting-${split}` });
    const head = h("div", { class: "rf-chart-head", title: "drag to zoom, double-click to zoom out" },
      [label, select, `vs ${xLabel}`]);
    chartsRow.append(h("div", { class: "rf-chart" }, [head, h("div", { class: "rf-chart-body" }, [div, waiting])]));
    const chart: Chart = {
      book: createChartBook(split, null), div, waiting, select, xLabel, queue: Promise.resolve(), options: [], preferred,
    };
    select.addEventListener("change", () => {
      chart.book.metric = select.value || null;
      scheduleRender({ charts: true, table: true });
    });
    return chart;
  }
  charts.push(makeChart("train", "train", "step", "loss"));
  charts.push(makeChart("eval", "eval", "samples seen", "eval_loss"));
  const evalChart = charts[1];

  // --- run table --------------------------------------------------------------------------------
  const table = h("table", { class: "rf-table", "data-testid": "rf-runs" });
  const thead = h("thead");
  const tbody = h("tbody");
  table.append(thead, tbody);
  root.append(h("div", { class: "rf-table-wrap" }, [table]));
  const messages = h("div", { class: "rf-messages", "data-testid": "rf-messages" });
  root.append(messages);

  // --- clone editor, traceback, time split -----------------------------------------------------
  const editorBox = h("div", { class: "rf-box", "data-testid": "rf-clone-editor" });
  editorBox.style.display = "none";
  const tracebackBox = h("div", { class: "rf-box", "data-testid": "rf-traceback" });
  tracebackBox.style.display = "none";
  root.append(editorBox, tracebackBox);
  const timeSummary = h("summary", { text: "engine time split" });
  const timeDiv = h("div", { class: "rf-time-plot", "data-testid": "rf-time-split" });
  const timeDetails = h("details", { open: "" }, [timeSummary, timeDiv]);
  root.append(timeDetails);

  // --- messages -------------------------------------------------------------------------------
  function say(text: string, kind: "ok" | "error" | "note" = "note"): void {
    messages.textContent = text;
    messages.className = `rf-messages ${kind === "error" ? "rf-error" : kind === "ok" ? "rf-ok" : "rf-note"}`;
  }

  // --- rendering, coalesced into one animation frame --------------------------------------------
  let pendingRender = { charts: false, table: false, time: false, header: false };
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
      try {
        if (what.header) renderHeader();
        if (what.charts) renderCharts();
        if (what.table) renderTable();
        if (what.time) renderTimeSplit();
      } catch (err) {
        say(`panel render error: ${String(err)}`, "error");
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
        if (s === "pending") span.title = "runs train one at a time on the device; these wait for their turn";
        return span;
      }),
    );
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
    const empty = chart.book.metric === null || ![...state.runs.values()].some(
      (r) => ((chart.book.split === "train" ? r.train : r.eval)[chart.book.metric!]?.x.length ?? 0) > 0);
    chart.waiting.textContent = empty ? waitingText(state, chart.book.split) : "";
    chart.waiting.style.display = empty ? "" : "none";
    chart.div.style.visibility = empty ? "hidden" : "";
  }

  function applyPlan(chart: Chart, plan: ChartPlan): Promise<unknown> {
    const metric = chart.book.metric ?? "";
    const layout = {
      ...themeLayout(root),
      xaxis: { ...(themeLayout(root).xaxis as object), title: { text: chart.xLabel, font: { size: 11 } } },
      yaxis: { ...(themeLayout(root).yaxis as object), title: { text: metric, font: { size: 11 } } },
      uirevision: metric,
    };
    // No toolbar: it floats over the top right of the plot and hides points there; drag zooms and a
    // double-click zooms out without it.
    const config = { displaylogo: false, responsive: true, displayModeBar: false };
    let p: Promise<unknown> = Promise.resolve();
    if (plan.reset) {
      p = p.then(() => Plotly.react(chart.div, plan.traces.map((t) => toPlotlyTrace(t, chart.xLabel, metric)), layout, config));
      return p;
    }
    if (plan.add.length) {
      p = p.then(() => Plotly.addTraces(chart.div, plan.add.map((t) => toPlotlyTrace(t, chart.xLabel, metric))));
    }
    if (plan.extend.indices.length) {
      const update = { x: plan.extend.x, y: plan.extend.y as number[][] };
      p = p.then(() => Plotly.extendTraces(chart.div, update, plan.extend.indices));
    }
    if (plan.restyle.indices.length) {
      const names = plan.restyle.indices.map((i) => {
        const id = chart.book.order[i];
        const run = state.runs.get(id);
        return run && run.status === "deleted" ? `run ${id} (deleted)` : `run ${id}`;
      });
      p = p.then(() => Plotly.restyle(chart.div, { "line.dash": plan.restyle.dash, name: names }, plan.restyle.indices));
    }
    return p;
  }

  function renderCharts(): void {
    for (const chart of charts) {
      updateSelect(chart);
      const plan = planChart(state, chart.book);
      if (planIsEmpty(plan)) continue;
      chart.queue = chart.queue
        .then(() => applyPlan(chart, plan))
        .catch((err) => {
          // Whatever failed, the next render redraws this chart from the state.
          chart.book.drawnMetric = null;
          say(`chart error: ${String(err)}`, "error");
        });
    }
  }

  // --- the run table, keyed by run id so buttons stay put while rows update ------------------
  // Id, status and the buttons come first so that they stay in view in a narrow notebook; then
  // only the knobs that differ between runs, values clipped with the full text on hover.
  interface Row {
    tr: HTMLTableRowElement;
    status: HTMLSpanElement;
    knobCells: HTMLSpanElement[];
    progressBar: HTMLSpanElement;
    progressText: HTMLSpanElement;
    chunkText: HTMLDivElement;
    trainLoss: HTMLTableCellElement;
    latest: HTMLSpanElement;
    best: HTMLDivElement;
    parent: HTMLTableCellElement | null;
    note: HTMLDivElement;
    buttons: Record<"stop" | "resume" | "delete" | "clone" | "traceback", HTMLButtonElement>;
    busy: boolean;
  }
  const rows = new Map<number, Row>();
  let columnsKey = "";

  function renderTable(): void {
    const knobs = knobColumns(state);
    const metric = evalChart.book.metric;
    const lineage = [...state.runs.values()].some((r) => r.parent !== null);
    const key = JSON.stringify([knobs, metric, lineage]);
    if (key !== columnsKey) {
      columnsKey = key;
      const heads: [string, string][] = [
        ["run", ""], ["status", ""], ["", "Stop · Resume · Delete · Clone"],
        ...knobs.map((k): [string, string] => [readableKnob(k), k]),
        ["progress", "optimizer steps, and the last chunk trained"], ["train loss", "latest training loss"],
        [metric ?? "eval", `latest ${metric ?? "eval metric"} (and the best so far)`],
        ...(lineage ? [["parent", "the run this one was cloned from"] as [string, string]] : []),
      ];
      thead.replaceChildren(h("tr", {}, heads.map(([t, title]) => h("th", title ? { text: t, title } : { text: t }))));
      rows.clear();
      tbody.replaceChildren();
    }
    for (const run of [...state.runs.values()].sort((a, b) => a.id - b.id)) {
      let row = rows.get(run.id);
      if (!row) {
        row = makeRow(run, knobs, lineage);
        rows.set(run.id, row);
        tbody.append(row.tr);
      }
      updateRow(row, run, knobs, metric);
    }
  }

  function makeRow(run: RunState, knobs: string[], lineage: boolean): Row {
    const tr = h("tr", { "data-run-id": String(run.id) });
    const swatch = h("span", { class: "rf-swatch" });
    swatch.style.background = runColor(run.id);
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
    const row: Row = {
      tr,
      status,
      knobCells,
      progressBar,
      progressText: progressTextEl,
      chunkText: chunkTextEl,
      trainLoss: h("td", { class: "rf-num" }),
      latest: h("span", { "data-testid": "rf-latest" }),
      best: h("div", { class: "rf-note" }),
      parent: lineage ? h("td") : null,
      note: h("div", { class: "rf-note rf-row-note" }),
      buttons,
      busy: false,
    };
    buttons.stop.addEventListener("click", () => simpleOp(row, run.id, "stop"));
    buttons.resume.addEventListener("click", () => simpleOp(row, run.id, "resume"));
    buttons.delete.addEventListener("click", () => deleteClicked(row, run.id));
    buttons.clone.addEventListener("click", () => openCloneEditor(run.id));
    buttons.traceback.addEventListener("click", () => showTraceback(run.id));
    tr.append(
      h("td", { class: "rf-id" }, [swatch, `${run.id}`]),
      h("td", {}, [status]),
      h("td", {}, [h("span", { class: "rf-actions" }, Object.values(buttons)), row.note]),
      ...knobCells.map((c) => h("td", { class: "rf-knob" }, [c])),
      h("td", {}, [h("span", { class: "rf-progress" }, [progressBar]), progressTextEl, chunkTextEl]),
      row.trainLoss,
      h("td", { class: "rf-num" }, [row.latest, row.best]),
      ...(row.parent ? [row.parent] : []),
    );
    return row;
  }

  function updateRow(row: Row, run: RunState, knobs: string[], metric: string | null): void {
    row.tr.dataset.status = run.status;
    row.status.textContent = run.status;
    row.status.style.background = STATUS_COLORS[run.status];
    knobs.forEach((k, i) => {
      const text = k in run.knobs ? formatKnobValue(run.knobs[k]) : "";
      row.knobCells[i].textContent = text;
      row.knobCells[i].title = `${k} = ${text}`;
    });
    row.progressBar.style.width = `${(progressFraction(run) * 100).toFixed(1)}%`;
    row.progressText.textContent = stepText(run);
    row.chunkText.textContent = chunkText(run);
    row.trainLoss.textContent = fmtNumber(run.latest["loss"]);
    row.latest.textContent = metric ? fmtNumber(run.latest[metric]) : "–";
    const best = metric ? run.best[metric] : undefined;
    row.best.textContent = best !== undefined && best !== run.latest[metric!] ? `best ${fmtNumber(best)}` : "";
    if (row.parent) row.parent.textContent = run.parent !== null ? `${run.parent}${run.warmStart ? " (warm)" : ""}` : "";
    const legal = legalOps(run.status);
    row.buttons.stop.disabled = row.busy || !legal.stop;
    row.buttons.resume.disabled = row.busy || !legal.resume;
    row.buttons.delete.disabled = row.busy || !legal.delete;
    row.buttons.clone.disabled = !legal.clone;
    row.buttons.traceback.style.display = run.hasError ? "" : "none";
    const op = run.lastOp;
    const note = run.reason ?? (op && !op.accepted ? `${op.op} refused: ${op.reason ?? ""}` : "");
    row.note.textContent = note;
    row.note.title = note;
    row.note.style.display = note ? "" : "none";
    row.status.title = run.reason ?? "";
  }

  async function simpleOp(row: Row, runId: number, op: "stop" | "resume" | "delete"): Promise<void> {
    row.busy = true;
    scheduleRender({ table: true });
    say(`${op} run ${runId}…`);
    const reply = await client.request({ type: "op", op, run_id: runId });
    row.busy = false;
    if (reply.ok) say(`${op} run ${runId}: accepted`, "ok");
    else say(`${op} run ${runId}: ${reply.error}`, "error");
    scheduleRender({ table: true });
    requestPull();
  }

  const deleteArmed = new Map<number, ReturnType<typeof setTimeout>>();
  function deleteClicked(row: Row, runId: number): void {
    // Two clicks instead of a modal confirm(), which blocks the whole notebook page.
    const armed = deleteArmed.get(runId);
    if (armed === undefined) {
      row.buttons.delete.textContent = "Confirm?";
      deleteArmed.set(runId, setTimeout(() => {
        deleteArmed.delete(runId);
        row.buttons.delete.textContent = "Delete";
      }, 4000));
      return;
    }
    clearTimeout(armed);
    deleteArmed.delete(runId);
    row.buttons.delete.textContent = "Delete";
    void simpleOp(row, runId, "delete");
  }

  // --- clone editor ---------------------------------------------------------------------------
  let editorSerial = 0;
  async function openCloneEditor(runId: number): Promise<void> {
    const serial = ++editorSerial;
    editorBox.style.display = "";
    // The form opens below the table: bring it into view, or the click seems to do nothing.
    editorBox.scrollIntoView({ block: "nearest", behavior: "smooth" });
    editorBox.replaceChildren(h("h4", { text: `Clone run ${runId}` }), h("div", { class: "rf-note", text: "loading knobs…" }));
    const reply = await client.request({ type: "editable", run_id: runId });
    if (serial !== editorSerial || disposed) return;
    if (!reply.ok || !reply.knobs || typeof reply.knobs !== "object") {
      editorBox.replaceChildren(
        h("h4", { text: `Clone run ${runId}` }),
        h("div", { class: "rf-error", text: reply.error ?? "no editable knobs" }),
        h("div", { class: "rf-buttons" }, [closeButton()]),
      );
      return;
    }
    buildCloneForm(runId, reply.knobs as Record<string, unknown>, serial);
  }

  function closeButton(): HTMLButtonElement {
    const b = h("button", { text: "Close", "data-testid": "rf-clone-cancel" });
    b.addEventListener("click", () => {
      editorSerial++;
      editorBox.style.display = "none";
      editorBox.replaceChildren();
    });
    return b;
  }

  function buildCloneForm(runId: number, original: Record<string, unknown>, serial: number): void {
    const { main, more } = cloneFormKnobs(Object.keys(original), knobColumns(state));
    const keys = [...main, ...more];
    const inputs = new Map<string, HTMLInputElement>();
    const fieldErrors = new Map<string, HTMLSpanElement>();
    const field = (k: string, grid: HTMLDivElement) => {
      const input = h("input", { type: "text", "data-knob": k, value: formatKnobValue(original[k]), title: k });
      input.value = formatKnobValue(original[k]);
      const err = h("span", { class: "rf-field-error", "data-error-for": k });
      inputs.set(k, input);
      fieldErrors.set(k, err);
      grid.append(h("label", { text: readableKnob(k), title: k }), input, err);
      input.addEventListener("input", () => scheduleCheck());
    };
    const mainForm = h("div", { class: "rf-form rf-form-main" });
    const moreForm = h("div", { class: "rf-form" });
    for (const k of main) field(k, mainForm);
    for (const k of more) field(k, moreForm);
    const moreBox = h("details", { class: "rf-more" }, [h("summary", { text: `other knobs (${more.length})` }), moreForm]);
    const warm = h("input", { type: "checkbox", "data-testid": "rf-clone-warm" });
    warm.addEventListener("change", () => scheduleCheck());
    const status = h("div", { class: "rf-note", "data-testid": "rf-clone-status" });
    const create = h("button", { class: "rf-primary", text: "Create clone", "data-testid": "rf-clone-create" });
    editorBox.replaceChildren(
      h("h4", { text: `Clone run ${runId}` }),
      keys.length ? mainForm : h("div", { class: "rf-note", text: "this run has no editable knobs" }),
      ...(more.length ? [moreBox] : []),
      h("div", { class: "rf-buttons" }, [
        h("label", {}, [warm, " warm start (continue from the parent's current weights)"]),
      ]),
      h("div", { class: "rf-buttons" }, [create, closeButton()]),
      status,
    );
    editorBox.scrollIntoView({ block: "nearest", behavior: "smooth" });
    let serverError = false;
    const gate = (ok: boolean) => {
      create.disabled = !ok;
      create.title = ok ? "" : "fix the marked fields first";
    };

    function collect(): { changes: Record<string, unknown>; ok: boolean } {
      const edited: Record<string, string> = {};
      for (const [k, input] of inputs) edited[k] = input.value;
      const { changes, errors } = knobChanges(original, edited);
      for (const [k, input] of inputs) {
        input.classList.toggle("rf-invalid", k in errors);
        input.classList.toggle("rf-changed", k in changes);
        fieldErrors.get(k)!.textContent = errors[k] ?? "";
      }
      const ok = Object.keys(errors).length === 0;
      gate(ok && !serverError);
      return { changes, ok };
    }

    function showServerError(error: string): void {
      status.className = "rf-error";
      status.textContent = error;
      const k = knobNamedIn(error, keys);
      if (k) {
        inputs.get(k)!.classList.add("rf-invalid");
        fieldErrors.get(k)!.textContent = error.length > 120 ? `${error.slice(0, 117)}…` : error;
      }
    }

    let checkTimer: ReturnType<typeof setTimeout> | undefined;
    let checkSerial = 0;
    function scheduleCheck(): void {
      // An edit may fix what the server refused; parse errors gate Create at once.
      serverError = false;
      collect();
      if (checkTimer !== undefined) clearTimeout(checkTimer);
      checkTimer = setTimeout(() => void check(), 400);
    }

    /** validate_only: Python builds the real configs and creates nothing. */
    async function check(): Promise<boolean> {
      const mine = ++checkSerial;
      const { changes, ok } = collect();
      if (!ok) {
        status.className = "rf-error";
        status.textContent = "fix the marked fields";
        return false;
      }
      if (Object.keys(changes).length === 0) {
        status.className = "rf-note";
        status.textContent = "no changes yet: edit a knob (a clone with no changes repeats its parent)";
      }
      const reply = await client.request({
        type: "op", op: "clone", run_id: runId, changes, warm_start: warm.checked, validate_only: true,
      });
      if (mine !== checkSerial || serial !== editorSerial) return false;
      if (!reply.ok) {
        serverError = true;
        gate(false);
        showServerError(reply.error ?? "refused");
        return false;
      }
      serverError = false;
      gate(true);
      if (Object.keys(changes).length > 0) {
        status.className = "rf-ok";
        status.textContent = `valid: ${Object.entries(changes).map(([k, v]) => `${k}=${formatKnobValue(v)}`).join(", ")}`;
      }
      return true;
    }

    create.addEventListener("click", async () => {
      create.disabled = true;
      try {
        if (!(await check())) return;
        const { changes } = collect();
        const reply = await client.request({
          type: "op", op: "clone", run_id: runId, changes, warm_start: warm.checked, validate_only: false,
        });
        if (serial !== editorSerial) return;
        if (!reply.ok) {
          showServerError(reply.error ?? "refused");
          return;
        }
        say(`cloned run ${runId} as run ${String(reply.new_run_id)}`, "ok");
        editorSerial++;
        editorBox.style.display = "none";
        editorBox.replaceChildren();
        requestPull();
      } finally {
        gate(!serverError && collect().ok);
      }
    });
  }

  // --- traceback --------------------------------------------------------------------------------
  async function showTraceback(runId: number): Promise<void> {
    tracebackBox.style.display = "";
    tracebackBox.replaceChildren(h("h4", { text: `Run ${runId}: traceback` }), h("div", { class: "rf-note", text: "loading…" }));
    const reply = await client.request({ type: "traceback", run_id: runId });
    const close = h("button", { text: "Close" });
    close.addEventListener("click", () => {
      tracebackBox.style.display = "none";
      tracebackBox.replaceChildren();
    });
    const body = reply.ok
      ? h("pre", { class: "rf-traceback", text: typeof reply.traceback === "string" ? reply.traceback : "(no traceback recorded)" })
      : h("div", { class: "rf-error", text: reply.error ?? "failed" });
    tracebackBox.replaceChildren(h("h4", { text: `Run ${runId}: traceback` }), body, h("div", { class: "rf-buttons" }, [close]));
  }

  // --- engine time split ------------------------------------------------------------------------
  let lastTimeDraw = 0;
  let timeTimer: ReturnType<typeof setTimeout> | undefined;
  function renderTimeSplit(): void {
    const now = Date.now();
    if (now - lastTimeDraw < TIME_SPLIT_REDRAW_MS) {
      if (timeTimer === undefined) {
        timeTimer = setTimeout(() => {
          timeTimer = undefined;
          scheduleRender({ time: true });
        }, TIME_SPLIT_REDRAW_MS);
      }
      return;
    }
    lastTimeDraw = now;
    const fig = timeSplitFigure(state);
    if (fig.total <= 0) {
      timeSummary.textContent = "engine time split (after the first chunk)";
      return;
    }
    const pct = (v: number) => `${((100 * v) / fig.total).toFixed(1)}%`;
    timeSummary.textContent =
      `engine time ${fmtSeconds(fig.total)}: train ${pct(fig.values.train[0])} · eval ${pct(fig.values.eval[0])} · ` +
      `swap ${pct(fig.values.swap[0])} · other ${pct(fig.values.other[0])} (overhead ${(fig.overhead * 100).toFixed(1)}%)`;
    const colors = { train: "#1a7f37", eval: "#0b61a4", swap: "#b58900", other: "#8a8a8a" };
    const rowsRev = [...fig.rows].reverse();
    const data = fig.categories.map((c) => ({
      type: "bar",
      orientation: "h",
      name: c,
      y: rowsRev,
      x: [...fig.values[c]].reverse(),
      marker: { color: colors[c] },
      hovertemplate: `%{y} ${c}: %{x:.2f} s<extra></extra>`,
    }));
    const base = themeLayout(root);
    const layout = {
      ...base,
      barmode: "stack",
      height: 70 + 22 * fig.rows.length,
      margin: { l: 70, r: 8, t: 4, b: 30 },
      legend: { orientation: "h", y: 1.15, font: { size: 10 } },
      xaxis: { ...(base.xaxis as object), title: { text: "seconds", font: { size: 11 } } },
    };
    void Plotly.react(timeDiv, data, layout, { displaylogo: false, displayModeBar: false, responsive: true });
  }

  // --- protocol: push, pull, snapshot -----------------------------------------------------------
  let lastPushAt = 0;
  function absorb(events: unknown, lastSeq: unknown): void {
    noteKnownSeq(state, lastSeq);
    const r = ingest(state, events);
    scheduleRender({
      header: true,
      charts: r.applied > 0,
      table: r.changedRuns.size > 0 || r.newMetrics,
      time: r.timeChanged,
    });
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
      if (disposed) return;
      if (reply.ok) {
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
      absorb(data.events, data.last_seq);
      if (needsPull(state)) requestPull();
    } else if (data.type === "reply") {
      client.handleReply(data as unknown as Reply);
      // Another view's pull reply carries events too; applying them is idempotent.
      if (Array.isArray(data.events)) absorb(data.events, data.last_seq);
    }
  };
  const onSnapshot = () => {
    applySnapshot(state, m.get("snapshot"));
    scheduleRender({ header: true });
    if (needsPull(state)) requestPull();
  };
  m.on("msg:custom", onCustom);
  m.on("change:snapshot", onSnapshot);
  applySnapshot(state, m.get("snapshot"));
  renderHeader();
  scheduleRender({ charts: true });
  requestPull();

  const timer = setInterval(() => {
    const now = Date.now();
    if (needsPull(state) || now - lastPushAt > PUSH_SILENCE_MS) requestPull();
  }, PULL_INTERVAL_MS);

  // Plotly's `responsive` only follows window resizes; notebook panes resize on their own.
  const resizeObserver =
    typeof ResizeObserver === "function"
      ? new ResizeObserver(() => {
          for (const c of charts) if (c.div.offsetWidth > 0 && c.book.drawnMetric !== null) void Plotly.Plots.resize(c.div);
        })
      : null;
  for (const c of charts) resizeObserver?.observe(c.div);

  return () => {
    disposed = true;
    clearInterval(timer);
    if (timeTimer !== undefined) clearTimeout(timeTimer);
    for (const t of deleteArmed.values()) clearTimeout(t);
    m.off("msg:custom", onCustom);
    m.off("change:snapshot", onSnapshot);
    resizeObserver?.disconnect();
    client.dispose();
    for (const c of charts) Plotly.purge(c.div);
    Plotly.purge(timeDiv);
    el.replaceChildren();
  };
}

export default { render };
