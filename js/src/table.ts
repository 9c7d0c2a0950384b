/**
 * What the run table derives from the state: its knob columns, each row's buttons and status
 * badge, the header counts, the "hide:" filters and the folded group, the sort and the order held
 * while the pointer is over the table. No DOM (./index.ts draws it), so vitest drives it.
 */
import { has, lowerIsBetter, STATUSES, type PanelState, type QueuedOp, type RunState, type RunStatus } from "./state";
import { progressFraction } from "./format";

export interface LegalOps {
  stop: boolean;
  resume: boolean;
  delete: boolean;
  clone: boolean;
}

/**
 * Which buttons a run's status enables (DESIGN §5); with an op queued for the run, the status
 * that op will leave it in (so Stop is off once a stop is queued, as Python would refuse it).
 */
export function legalOps(status: RunStatus, queued: QueuedOp | null = null): LegalOps {
  if (queued !== null) status = queued === "stop" ? "stopped" : queued === "resume" ? "pending" : "deleted";
  return {
    stop: status === "pending" || status === "running",
    resume: status === "stopped",
    delete: status !== "deleted",
    clone: status !== "deleted",
  };
}

/**
 * Knob columns of the run table: the knobs whose values differ between the runs shown (deleted
 * runs aside), in a stable order. A knob every run shares says nothing about the comparison and
 * would only push the buttons out of view.
 */
export function knobColumns(state: PanelState): string[] {
  const runs = [...state.runs.values()].filter((r) => r.status !== "deleted");
  const keys = new Set<string>();
  for (const run of runs) for (const k of Object.keys(run.knobs)) keys.add(k);
  return [...keys]
    .filter((k) => new Set(runs.map((r) => (k in r.knobs ? JSON.stringify(r.knobs[k]) : "\u0000absent"))).size > 1)
    .sort();
}

/**
 * The run training now: Python's `on_device` when that run is running; without it (an older
 * kernel, or before the first snapshot), the running run that most recently took the device
 * (turned running, or ended a chunk; its adapter stays loaded until the next run swaps in).
 * None once the experiment ended: nothing trains then.
 */
export function trainingRun(state: PanelState): number | null {
  if (state.ended) return null;
  if (state.onDevice !== null && state.runs.get(state.onDevice)?.status === "running") return state.onDevice;
  let best: RunState | null = null;
  for (const r of state.runs.values()) {
    if (r.status === "running" && (best === null || r.deviceSeq > best.deviceSeq)) best = r;
  }
  return best ? best.id : null;
}

/** "stopping…": a run whose op is queued says so until the engine applies it. */
export const QUEUED_WORDS: Record<QueuedOp, string> = { stop: "stopping…", resume: "resuming…", delete: "deleting…" };

/**
 * A row's badge: the run's status in get_runs_info()'s words (pending, running, stopped, ...),
 * "pruned" for a run a pruner stopped, or the op queued for it ("stopping…"). `onDevice` marks the
 * one run training now (runs train one chunk at a time). `status` picks the colour.
 */
export function statusBadge(run: RunState, state: PanelState): {
  text: string; status: RunStatus; title: string; onDevice: boolean;
} {
  const queued = state.queued.get(run.id) ?? null;
  const onDevice = (run.status === "running" || run.status === "pending") && run.id === trainingRun(state);
  if (queued !== null && run.status !== "deleted") {
    return {
      text: QUEUED_WORDS[queued], status: run.status, onDevice,
      title: `${queued} accepted: it applies at the run's next chunk boundary (the run is ${run.status} until then)`,
    };
  }
  if (run.status === "running" || run.status === "pending") {
    if (onDevice) {
      return { text: run.status, status: "running", onDevice, title: "this run has the device now (runs train one chunk at a time)" };
    }
    return {
      text: run.status, status: "pending", onDevice,
      title: run.status === "pending"
        ? "not started yet: runs train one chunk at a time on the device, and this one waits for its turn"
        : "started; runs train one chunk at a time on the device and this one waits for its next turn",
    };
  }
  if (isPruned(run)) return { text: "pruned", status: "stopped", onDevice, title: run.reason ?? "stopped by the pruner" };
  return { text: run.status, status: run.status, onDevice, title: run.reason ?? "" };
}

/**
 * "2 running · 1 pending · 1 stopped": the statuses in get_runs_info()'s words; the run on the
 * device is named in the running count's title (see `trainingRun`).
 */
export function headerCounts(state: PanelState): [string, RunStatus][] {
  const c = statusCounts(state);
  const out: [string, RunStatus][] = [];
  // "4 running" alone read as four runs training at once: say how many have the device.
  const onDevice = trainingRun(state) !== null ? 1 : 0;
  if (c.running > 0) out.push([c.running > onDevice && onDevice > 0 ? `${c.running} running (${onDevice} on device)` : `${c.running} running`, "running"]);
  if (c.pending > 0) out.push([`${c.pending} pending`, "pending"]);
  const pruned = [...state.runs.values()].filter(isPruned).length;
  for (const s of ["stopped", "completed", "failed", "deleted"] as RunStatus[]) {
    const n = s === "stopped" ? c[s] - pruned : c[s];
    if (n > 0) out.push([`${n} ${s}`, s]);
    if (s === "stopped" && pruned > 0) out.push([`${pruned} pruned`, "stopped"]);
  }
  return out;
}

/** The title of a header count: the running count names the run on the device, if one trains. */
export function headerCountTitle(state: PanelState, status: RunStatus): string {
  if (status === "running") {
    const id = trainingRun(state);
    return id === null
      ? "runs that have started; they train one chunk at a time on the device"
      : `run ${id} has the device now (its row is marked ▶ on device); the other running runs wait for their next turn`;
  }
  if (status === "pending") return "not started yet: runs train one chunk at a time on the device, and these wait for their turn";
  return "";
}

export function statusCounts(state: PanelState): Record<RunStatus, number> {
  const counts = { pending: 0, running: 0, stopped: 0, completed: 0, failed: 0, deleted: 0 };
  for (const run of state.runs.values()) counts[run.status]++;
  return counts;
}

export function isPruned(run: RunState): boolean {
  return run.status === "stopped" && run.pruned;
}

/** Runs the table folds into one group row: pruned and deleted ones. */
export function isCollapsible(run: RunState): boolean {
  return run.status === "deleted" || isPruned(run);
}

export interface StatusFilters {
  stopped: boolean;
  pruned: boolean;
  deleted: boolean;
}

/** What the table shares with the charts: the hovered and pinned runs, hidden swatches, filters. */
export interface Focus {
  hover: number | null;
  pinned: Set<number>;
  hiddenRuns: Set<number>;
  hide: StatusFilters;
}

/** Whether a run's curves and row show under the "hide ..." filters. */
export function runShown(run: RunState, hide: StatusFilters): boolean {
  if (run.status === "deleted") return !hide.deleted;
  if (isPruned(run)) return !hide.pruned;
  if (run.status === "stopped") return !hide.stopped;
  return true;
}

/** A column the table sorts by; `knob:<name>` is a knob column (the knob's dotted name). */
export type SortColumn = "auto" | "id" | "status" | "progress" | "loss" | "eval" | `knob:${string}`;
export interface SortKey {
  column: SortColumn;
  /** true: best / largest first, as the column's header arrow shows. */
  descending: boolean;
}

/** The sort column of a knob's header. */
export function knobSort(knob: string): SortColumn {
  return `knob:${knob}`;
}

/**
 * The value a run sorts by; undefined sorts last whatever the direction. A knob sorts by its
 * number, or by its text for names and lists; a knob left at its default sorts last.
 */
function sortValue(run: RunState, column: SortColumn, metric: string | null): number | string | undefined {
  if (column.startsWith("knob:")) {
    const k = column.slice("knob:".length);
    if (!has(run.knobs, k)) return undefined;
    const v = run.knobs[k];
    if (typeof v === "number") return Number.isNaN(v) ? undefined : v;
    if (v === null || v === undefined) return undefined;
    return typeof v === "string" ? v : JSON.stringify(v);
  }
  switch (column) {
    case "progress":
      return progressFraction(run);
    case "loss":
      return has(run.latest, "loss") ? run.latest["loss"] ?? undefined : undefined;
    case "eval":
      return metric === null || !has(run.best, metric) ? undefined : run.best[metric];
    case "status":
      return STATUSES.indexOf(run.status);
    default:
      return run.id;
  }
}

/** Numbers before text, numbers by value, text in a natural order ("r=8" before "r=16"). */
function compareValues(a: number | string, b: number | string): number {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return a.localeCompare(b, undefined, { numeric: true });
}

/**
 * "auto" sorts by the best eval metric, best first, with runs that have none yet after the rest
 * in id order (so before any eval it reads as id order). It never switches to another column by
 * itself: a clone without an eval value joins the end instead of reordering the whole table.
 */
export function effectiveSort(_state: PanelState, key: SortKey, metric: string | null): SortKey {
  if (key.column !== "auto") return key;
  if (metric !== null) return { column: "eval", descending: !lowerIsBetter(metric) };
  return { column: "id", descending: false };
}

/** Run ids in table order; ties (and missing values, always last) fall back to the run id. */
export function sortRuns(runs: RunState[], key: SortKey, metric: string | null): number[] {
  const dir = key.descending ? -1 : 1;
  return [...runs]
    .sort((a, b) => {
      const va = sortValue(a, key.column, metric);
      const vb = sortValue(b, key.column, metric);
      if (va === undefined && vb !== undefined) return 1;
      if (vb === undefined && va !== undefined) return -1;
      if (va !== undefined && vb !== undefined && va !== vb) return compareValues(va, vb) * dir || a.id - b.id;
      return a.id - b.id;
    })
    .map((r) => r.id);
}

/**
 * The table order to show. While `hold` is set (the pointer is over the table, or a Delete waits
 * for its confirm) rows keep the places they had: a row that moves between aim and click gets the
 * wrong run stopped (review_panel.md finding 2). Rows that appear go to the end; rows that leave
 * (deleted, filtered) are dropped. Without `hold`, the wanted (sorted) order.
 */
export function heldOrder<T>(previous: readonly T[], wanted: readonly T[], hold: boolean): T[] {
  if (!hold || previous.length === 0) return [...wanted];
  const want = new Set(wanted);
  const kept = previous.filter((id) => want.has(id));
  const have = new Set(kept);
  return [...kept, ...wanted.filter((id) => !have.has(id))];
}
