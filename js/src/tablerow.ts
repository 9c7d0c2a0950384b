/**
 * One row of the run table: its cells and buttons (built once per run and set of columns, so a
 * button under the pointer stays the same node) and what each render writes into them.
 */
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
  stepText,
} from "./format";
import { runKey, STATUS_COLORS } from "./palette";
import { has, setKnobs, type PanelState, type RunState } from "./state";
import { suggestionOpen } from "./suggest";
import { legalOps, statusBadge, type Focus } from "./table";
import { workerCell } from "./workers";

/** The ops a row's buttons send as they are (Delete first asks for a second click). */
export type SimpleOp = "stop" | "resume" | "delete" | "confirm_suggestion" | "ignore_suggestion";

// Id, status and the buttons come first so that they stay in view in a narrow notebook; then
// only the knobs that differ between runs, values clipped with the full text on hover.
export interface Row {
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

/** The columns a row has besides the fixed ones (a change of any rebuilds every row). */
export interface RowColumns {
  knobs: string[];
  lineage: boolean;
  workers: boolean;
}

/** What a row's pointer events and buttons act on. */
export interface RowActions {
  focus: Focus;
  /** The hovered or pinned runs changed. */
  emphasize: () => void;
  /** A swatch hid or showed a run's curves. */
  hiddenChanged: () => void;
  simpleOp: (row: Row, runId: number, op: SimpleOp) => void;
  deleteClicked: (row: Row, runId: number) => void;
  openClone: (runId: number) => void;
  showTraceback: (runId: number) => void;
}

/** What a render writes into a row, beyond the run itself. */
export interface RowContext {
  state: PanelState;
  knobs: string[];
  metric: string | null;
  /** Why the panel is disconnected, or null while it is live. */
  disconnected: () => string | null;
  /** An op of this run waits for its reply. */
  busy: (runId: number) => boolean;
  /** This run's Delete waits for its confirming click. */
  armed: (runId: number) => boolean;
}

export function makeRow(run: RunState, columns: RowColumns, actions: RowActions): Row {
  const { knobs, lineage, workers } = columns;
  const tr = h("tr", { "data-run-id": String(run.id) });
  const swatch = runSwatch(run, actions);
  tr.classList.toggle("rf-pinned", actions.focus.pinned.has(run.id));
  followPointer(tr, run.id, actions);
  const status = h("span", { class: "rf-status", "data-testid": "rf-status" });
  const knobCells = knobs.map(() => h("span", { class: "rf-clip" }));
  const progressBar = h("span");
  const progressTextEl = h("span", { class: "rf-progress-text" });
  const chunkTextEl = h("div", { class: "rf-note" });
  const buttons = opButtons(run.id);
  const suggestionText = h("span", { class: "rf-suggest-text" });
  const answers = suggestionAnswers(run.id);
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
  buttons.stop.addEventListener("click", () => actions.simpleOp(row, run.id, "stop"));
  buttons.resume.addEventListener("click", () => actions.simpleOp(row, run.id, "resume"));
  buttons.delete.addEventListener("click", () => actions.deleteClicked(row, run.id));
  buttons.clone.addEventListener("click", () => void actions.openClone(run.id));
  buttons.traceback.addEventListener("click", () => void actions.showTraceback(run.id));
  answers.confirm_suggestion.addEventListener("click", () => actions.simpleOp(row, run.id, "confirm_suggestion"));
  answers.ignore_suggestion.addEventListener("click", () => actions.simpleOp(row, run.id, "ignore_suggestion"));
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

/** The run's colour key: a click hides or shows its curves. */
function runSwatch(run: RunState, actions: RowActions): HTMLSpanElement {
  const { hiddenRuns } = actions.focus;
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
    actions.hiddenChanged();
  });
  swatch.classList.toggle("rf-swatch-off", hiddenRuns.has(run.id));
  return swatch;
}

/** Hovering a row emphasizes its run's curves; a click on the row (not a button) pins them. */
function followPointer(tr: HTMLTableRowElement, runId: number, actions: RowActions): void {
  const { focus } = actions;
  tr.addEventListener("mouseenter", () => {
    focus.hover = runId;
    actions.emphasize();
  });
  tr.addEventListener("mouseleave", () => {
    if (focus.hover === runId) focus.hover = null;
    actions.emphasize();
  });
  tr.addEventListener("click", (ev) => {
    // Buttons and form fields in the row do their own thing.
    if ((ev.target as HTMLElement).closest("button, input, select, a")) return;
    if (focus.pinned.has(runId)) focus.pinned.delete(runId);
    else focus.pinned.add(runId);
    tr.classList.toggle("rf-pinned", focus.pinned.has(runId));
    actions.emphasize();
  });
}

function opButtons(runId: number): Row["buttons"] {
  const mk = (op: "stop" | "resume" | "delete" | "clone" | "traceback", label: string) =>
    h("button", { "data-op": op, title: `${label} run ${runId}`, text: label });
  const buttons = {
    stop: mk("stop", "Stop"),
    resume: mk("resume", "Resume"),
    delete: mk("delete", "Delete"),
    clone: mk("clone", "Clone"),
    traceback: mk("traceback", "Traceback"),
  };
  buttons.delete.classList.add("rf-danger");
  return buttons;
}

function suggestionAnswers(runId: number): Row["answers"] {
  return {
    confirm_suggestion: h("button", {
      "data-op": "confirm_suggestion", class: "rf-primary", text: "Confirm",
      title: `stop run ${runId} as the pruner suggests`,
    }),
    ignore_suggestion: h("button", {
      "data-op": "ignore_suggestion", text: "Ignore",
      title: `keep training run ${runId}; the pruner will not judge it again`,
    }),
  };
}

export function updateRow(row: Row, run: RunState, ctx: RowContext): void {
  const { state } = ctx;
  row.tr.dataset.status = run.status;
  const badge = statusBadge(run, state);
  row.status.textContent = badge.text;
  row.status.style.background = STATUS_COLORS[badge.status];
  row.status.classList.toggle("rf-queued", state.queued.has(run.id));
  row.device.style.display = badge.onDevice ? "" : "none";
  row.device.title = badge.onDevice ? "this run has the device now (runs train one chunk at a time)" : "";
  updateKnobCells(row, run, ctx.knobs);
  updateProgress(row, run, state, ctx.metric);
  updateButtons(row, run, ctx);
  const op = run.lastOp;
  const note = run.reason ?? (op && !op.accepted ? `${op.op} refused: ${op.reason ?? ""}` : "");
  row.note.textContent = note;
  row.note.title = note;
  row.note.style.display = note ? "" : "none";
  row.status.title = badge.title;
}

function updateKnobCells(row: Row, run: RunState, knobs: string[]): void {
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
}

/** Progress, the metrics, the worker and the parent: what training changes. */
function updateProgress(row: Row, run: RunState, state: PanelState, metric: string | null): void {
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
}

/** Which ops the run allows now, and the pruner's open question. */
function updateButtons(row: Row, run: RunState, ctx: RowContext): void {
  const { state } = ctx;
  const legal = legalOps(run.status, state.queued.get(run.id) ?? null);
  // disconnected, or a folder opened for its results only: nothing to steer
  const off = ctx.disconnected() !== null || state.readOnly;
  const busy = ctx.busy(run.id);
  row.buttons.stop.disabled = off || busy || !legal.stop;
  row.buttons.resume.disabled = off || busy || !legal.resume;
  row.buttons.delete.disabled = off || busy || !legal.delete;
  const armed = ctx.armed(run.id);
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
}
