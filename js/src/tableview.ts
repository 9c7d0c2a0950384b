/**
 * The run table: a row per run keyed by run id (so buttons stay the same nodes while rows
 * update), sortable headers, the "hide:" filters, the folded pruned/deleted group, and the
 * row's ops (Stop, Resume, two-click Delete, Clone, Traceback, the pruner's suggestion).
 * Rows hold their places while the pointer is on the table or a Delete waits for its confirm.
 */
import type { Client } from "./client";
import { h } from "./dom";
import {
  chunkText,
  dataStartText,
  fmtNumber,
  formatKnobValue,
  knobCellText,
  stepTitle,
  ownEpoch,
  progressFraction,
  readableKnob,
  readableMetric,
  stepText,
} from "./format";
import { runKey, STATUS_COLORS } from "./palette";
import { has, lowerIsBetter, noteQueued, setKnobs, type PanelState, type RunState } from "./state";
import { suggestionOpen } from "./suggest";
import {
  effectiveSort,
  heldOrder,
  isCollapsible,
  isPruned,
  knobColumns,
  knobSort,
  legalOps,
  runShown,
  sortRuns,
  statusBadge,
  type Focus,
  type SortColumn,
  type SortKey,
  type StatusFilters,
} from "./table";
import { hasWorkers, workerCell } from "./workers";

export type { Focus };

const OP_WORDS: Record<SimpleOp, string> = {
  stop: "stop", resume: "resume", delete: "delete",
  confirm_suggestion: "confirm the pruner's stop of", ignore_suggestion: "ignore the pruner's suggestion for",
};
/** A click with no reply after this long says so (the kernel answers between cells only). */
const OP_SLOW_MS = 4000;
/** A confirming second click on Delete sooner than this is one double click, not a confirmation. */
const DELETE_CONFIRM_MIN_MS = 400;
type SimpleOp = "stop" | "resume" | "delete" | "confirm_suggestion" | "ignore_suggestion";

export interface RunTableContext {
  state: PanelState;
  client: Client;
  focus: Focus;
  /** The eval chart's metric: the table's eval column and its sort. */
  metric: () => string | null;
  /** Why the panel is disconnected, or null while it is live. */
  disconnected: () => string | null;
  scheduleRender: (what: { charts?: boolean; table?: boolean; header?: boolean }) => void;
  /** The hovered or pinned runs changed: redraw the charts' emphasis. */
  emphasize: () => void;
  /** A swatch hid or showed a run's curves. */
  hiddenChanged: () => void;
  persistPrefs: () => void;
  say: (text: string, kind?: "ok" | "error" | "note") => void;
  requestPull: () => void;
  openClone: (runId: number) => void;
  showTraceback: (runId: number) => void;
}

export interface RunTable {
  filterBox: HTMLDivElement;
  wrap: HTMLDivElement;
  render(): void;
  /** Mark the row of the run the pointer is on in a chart (null: none). */
  highlight(runId: number | null): void;
  sortKey(): SortKey;
  groupOpen(): boolean;
  /** Bring back a remembered sort and group state; the filters are read from `focus.hide`. */
  restore(sort: SortKey, groupOpen: boolean): void;
  dispose(): void;
}

export function createRunTable(ctx: RunTableContext): RunTable {
  const { state, focus } = ctx;
  const { pinned, hiddenRuns, hide } = focus;
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
      ctx.persistPrefs();
      ctx.scheduleRender({ charts: true, table: true });
    });
    filterBox.append(h("label", { title: `hide ${s} runs in the charts and the table` }, [box, ` ${s}`]));
  }
  const hiddenNote = h("span", { class: "rf-note", "data-testid": "rf-hidden-note" });
  filterBox.append(hiddenNote);
  const tableWrap = h("div", { class: "rf-table-wrap" }, [table]);
  // Columns past the right edge are easy to miss (the sideways scrollbar sits below the rows):
  // say so beside the filters while the table is wider than its box.
  const moreNote = h("span", { class: "rf-note rf-more-cols", "data-testid": "rf-more-columns" });
  moreNote.style.display = "none";
  filterBox.append(moreNote);
  const noteOverflow = () => {
    const hidden = tableWrap.scrollWidth - tableWrap.clientWidth;
    const atEnd = tableWrap.scrollLeft >= hidden - 1;
    moreNote.style.display = hidden > 1 ? "" : "none";
    moreNote.textContent = atEnd ? "◂ more columns on the left: scroll the table sideways"
      : "more columns on the right: scroll the table sideways ▸";
  };
  tableWrap.addEventListener("scroll", noteOverflow, { passive: true });
  const sizes = typeof ResizeObserver === "function" ? new ResizeObserver(noteOverflow) : null;
  sizes?.observe(tableWrap);
  sizes?.observe(table);
  // The auto sort waits while the pointer is over the table; leaving it applies the order.
  let pointerInTable = false;
  tableWrap.addEventListener("mouseenter", () => {
    pointerInTable = true;
  });
  tableWrap.addEventListener("mouseleave", () => {
    pointerInTable = false;
    ctx.scheduleRender({ table: true });
  });

  // --- the rows, keyed by run id so buttons stay put while rows update ------------------
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
  }
  const rows = new Map<number, Row>();
  // Per-run UI state lives outside the Row: a change of columns rebuilds every Row.
  const busyRuns = new Set<number>();
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
    ctx.persistPrefs();
    ctx.scheduleRender({ table: true });
  });
  let shownOrder = "";
  let shownIds: (number | "group")[] = [];
  // A header click is a request to reorder now, pointer over the table or not.
  let reorderNow = false;

  /** The sort the table shows: a knob sort whose column is gone reads as the default. */
  function shownSort(knobs: string[], metric: string | null): SortKey {
    const gone = sortKey.column.startsWith("knob:") && !knobs.includes(sortKey.column.slice("knob:".length));
    return effectiveSort(state, gone ? { column: "auto", descending: false } : sortKey, metric);
  }

  function headerClicked(column: SortColumn): void {
    const metric = ctx.metric();
    const current = shownSort(knobColumns(state), metric);
    // First click: the column's natural "best first" order; a second click reverses it.
    const natural = column === "eval" ? metric !== null && !lowerIsBetter(metric) : column === "progress";
    sortKey = current.column === column ? { column, descending: !current.descending } : { column, descending: natural };
    ctx.persistPrefs();
    reorderNow = true;
    ctx.scheduleRender({ table: true });
  }

  function render(): void {
    const knobs = knobColumns(state);
    const metric = ctx.metric();
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
        ...knobs.map((k): [string, string, SortColumn] => [readableKnob(k), k, knobSort(k)]),
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
    // A knob column sorted by goes away once its knob no longer differs: sort as by default
    // meanwhile, keeping the choice for when it comes back.
    const sort = shownSort(knobs, metric);
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
      if (focus.hover !== null && !order.includes(focus.hover)) {
        focus.hover = null;
        ctx.emphasize();
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
      ctx.hiddenChanged();
    });
    swatch.classList.toggle("rf-swatch-off", hiddenRuns.has(run.id));
    tr.classList.toggle("rf-pinned", pinned.has(run.id));
    tr.addEventListener("mouseenter", () => {
      focus.hover = run.id;
      ctx.emphasize();
    });
    tr.addEventListener("mouseleave", () => {
      if (focus.hover === run.id) focus.hover = null;
      ctx.emphasize();
    });
    tr.addEventListener("click", (ev) => {
      // Buttons and form fields in the row do their own thing.
      if ((ev.target as HTMLElement).closest("button, input, select, a")) return;
      if (pinned.has(run.id)) pinned.delete(run.id);
      else pinned.add(run.id);
      tr.classList.toggle("rf-pinned", pinned.has(run.id));
      ctx.emphasize();
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
    };
    buttons.stop.addEventListener("click", () => simpleOp(row, run.id, "stop"));
    buttons.resume.addEventListener("click", () => simpleOp(row, run.id, "resume"));
    buttons.delete.addEventListener("click", () => deleteClicked(row, run.id));
    buttons.clone.addEventListener("click", () => void ctx.openClone(run.id));
    buttons.traceback.addEventListener("click", () => void ctx.showTraceback(run.id));
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
      const own = setKnobs(run);
      const set = has(own, k);
      const text = set ? knobCellText(own[k]) : epochs !== undefined ? String(epochs) : "default";
      row.knobCells[i].textContent = text;
      row.knobCells[i].classList.toggle("rf-default", !set);
      row.knobCells[i].title = set ? `${k} = ${formatKnobValue(own[k])}` : `${k} not set: the trainer's default${epochs !== undefined ? ` (${epochs})` : ""}`;
    });
    row.progressBar.style.width = `${(progressFraction(run) * 100).toFixed(1)}%`;
    row.progressText.textContent = stepText(run);
    row.progressText.title = stepTitle(run);
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
    // disconnected, or a folder opened for its results only: nothing to steer
    const off = ctx.disconnected() !== null || state.readOnly;
    const busy = busyRuns.has(run.id);
    row.buttons.stop.disabled = off || busy || !legal.stop;
    row.buttons.resume.disabled = off || busy || !legal.resume;
    row.buttons.delete.disabled = off || busy || !legal.delete;
    const armed = deleteArmed.has(run.id);
    row.buttons.delete.textContent = armed ? "Confirm?" : "Delete";
    row.buttons.delete.title = armed ? `click again within 4 s to delete run ${run.id}` : `Delete run ${run.id}`;
    row.buttons.clone.disabled = off || !legal.clone;
    if (state.readOnly) {
      for (const b of [row.buttons.stop, row.buttons.resume, row.buttons.delete, row.buttons.clone]) {
        b.title = "opened read-only: nothing to steer here (see the header)";
      }
    }
    row.buttons.traceback.disabled = off;
    row.buttons.traceback.style.display = run.hasError ? "" : "none";
    const asked = suggestionOpen(run);
    row.suggestion.style.display = asked ? "" : "none";
    row.suggestionText.textContent = asked ? run.suggestion! : "";
    row.suggestion.title = asked ? run.suggestion! : "";
    row.answers.confirm_suggestion.disabled = off || busy;
    row.answers.ignore_suggestion.disabled = off || busy;
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
    if (ctx.disconnected() !== null) {
      ctx.say(`${words} run ${runId}: not sent, ${ctx.disconnected()}`, "error");
      return;
    }
    // A second click (a double click, or Stop then Resume before the first reply) would reach
    // the kernel before the next render disables the buttons: one op per row at a time.
    if (busyRuns.has(runId)) return;
    busyRuns.add(runId);
    setRowButtonsBusy(row);
    ctx.scheduleRender({ table: true });
    ctx.say(`${words} run ${runId}…`);
    // The kernel answers a click only between cells: past a few seconds, say why it waits.
    const slow = setTimeout(() => {
      if (busyRuns.has(runId) && ctx.disconnected() === null) {
        ctx.say(`${words} run ${runId}: no reply from the kernel after ${OP_SLOW_MS / 1000} s; a cell is `
          + "probably running (clicks act once it finishes)", "error");
      }
    }, OP_SLOW_MS);
    const reply = await ctx.client.request({ type: "op", op, run_id: runId });
    clearTimeout(slow);
    busyRuns.delete(runId);
    if (ctx.disconnected() !== null) ctx.say(`${words} run ${runId}: not delivered, ${ctx.disconnected()}`, "error");
    // Only a run training now waits for a boundary; the engine applies the rest on its next turn.
    else if (reply.ok) ctx.say(`${words} run ${runId}: accepted${(op === "stop" || op === "resume" || op === "delete") && state.runs.get(runId)?.status === "running" ? " (applies at its next chunk boundary)" : ""}`, "ok");
    else ctx.say(`${words} run ${runId}: ${reply.error}`, "error");
    if ("queued" in reply) noteQueued(state, reply.queued);
    ctx.scheduleRender({ table: true, header: true });
    if (ctx.disconnected() === null) ctx.requestPull();
  }

  /** Disable the row's op buttons now, not at the next frame (the render keeps them so). */
  function setRowButtonsBusy(row: Row): void {
    row.buttons.stop.disabled = true;
    row.buttons.resume.disabled = true;
    row.buttons.delete.disabled = true;
    row.answers.confirm_suggestion.disabled = true;
    row.answers.ignore_suggestion.disabled = true;
  }

  function deleteClicked(row: Row, runId: number): void {
    // Two clicks instead of a modal confirm(), which blocks the whole notebook page.
    const armed = deleteArmed.get(runId);
    if (armed === undefined) {
      // The confirm belongs to this run's own button, and rows hold their places while it is
      // armed, so the second click lands on the same run.
      row.buttons.delete.textContent = "Confirm?";
      row.buttons.delete.title = `click again within 4 s to delete run ${runId}`;
      ctx.say(`delete run ${runId}: click Confirm? within 4 s to delete it`);
      deleteArmed.set(runId, {
        at: performance.now(),
        timer: setTimeout(() => {
          deleteArmed.delete(runId);
          const now = rows.get(runId) ?? row;
          now.buttons.delete.textContent = "Delete";
          now.buttons.delete.title = `Delete run ${runId}`;
          ctx.say(`delete run ${runId}: not confirmed within 4 s, nothing deleted`);
          ctx.scheduleRender({ table: true });
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

  function restore(sort: SortKey, open: boolean): void {
    sortKey = { ...sort };
    groupOpen = open;
    for (const [k, box] of filterBoxes) box.checked = hide[k];
  }

  return {
    filterBox,
    wrap: tableWrap,
    render,
    highlight: (runId) => {
      for (const [rid, row] of rows) row.tr.classList.toggle("rf-hot", rid === runId);
    },
    sortKey: () => ({ ...sortKey }),
    groupOpen: () => groupOpen,
    restore,
    dispose: () => {
      for (const a of deleteArmed.values()) clearTimeout(a.timer);
      sizes?.disconnect();
    },
  };
}
