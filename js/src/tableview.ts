/**
 * The run table: a row per run keyed by run id (so buttons stay the same nodes while rows
 * update), sortable headers, the "hide:" filters, the folded pruned/deleted group, and the
 * row's ops (Stop, Resume, two-click Delete, Clone, Traceback, the pruner's suggestion).
 * Rows hold their places while the pointer is on the table or a Delete waits for its confirm.
 *
 * This module puts the parts together and orders the rows; the parts live beside it:
 * ./tablehead.ts (the columns and the sort), ./tablerow.ts (a row's cells and what they show),
 * ./tableops.ts (what the buttons send) and ./tablefilters.ts (the line above the table).
 */
import type { Client } from "./client";
import { h } from "./dom";
import type { PanelState, RunState } from "./state";
import { heldOrder, isCollapsible, isPruned, knobColumns, runShown, sortRuns, type Focus, type SortKey } from "./table";
import { createFilterBar } from "./tablefilters";
import { createTableHead } from "./tablehead";
import { createRowOps } from "./tableops";
import { makeRow, updateRow, type Row, type RowActions, type RowContext } from "./tablerow";
import { hasWorkers } from "./workers";

export type { Focus };

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
  const table = h("table", { class: "rf-table", "data-testid": "rf-runs" });
  const thead = h("thead");
  const tbody = h("tbody");
  table.append(thead, tbody);
  // The parts call the context's functions through it, as they stand at each call.
  const filters = createFilterBar({
    hide: focus.hide, persistPrefs: () => ctx.persistPrefs(), scheduleRender: (what) => ctx.scheduleRender(what),
  });
  const tableWrap = h("div", { class: "rf-table-wrap" }, [table]);
  const stopWatching = filters.watchOverflow(tableWrap, table);
  // The auto sort waits while the pointer is over the table; leaving it applies the order.
  let pointerInTable = false;
  tableWrap.addEventListener("mouseenter", () => {
    pointerInTable = true;
  });
  tableWrap.addEventListener("mouseleave", () => {
    pointerInTable = false;
    ctx.scheduleRender({ table: true });
  });

  // The rows, keyed by run id so buttons stay put while rows update.
  const rows = new Map<number, Row>();
  const ops = createRowOps(ctx, (runId) => rows.get(runId));
  const actions: RowActions = {
    focus,
    emphasize: () => ctx.emphasize(),
    hiddenChanged: () => ctx.hiddenChanged(),
    simpleOp: (row, runId, op) => void ops.simpleOp(row, runId, op),
    deleteClicked: ops.deleteClicked,
    openClone: (runId) => ctx.openClone(runId),
    showTraceback: (runId) => ctx.showTraceback(runId),
  };
  // A header click is a request to reorder now, pointer over the table or not.
  let reorderNow = false;
  const head = createTableHead(thead, {
    state,
    metric: () => ctx.metric(),
    persistPrefs: () => ctx.persistPrefs(),
    scheduleRender: (what) => ctx.scheduleRender(what),
    reorderNow: () => {
      reorderNow = true;
    },
  });
  let columnsKey = "";
  let rowColumnsKey = "";
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

  function render(): void {
    const knobs = knobColumns(state);
    const metric = ctx.metric();
    const lineage = [...state.runs.values()].some((r) => r.parent !== null);
    const workers = hasWorkers(state);
    renderColumns(knobs, metric, lineage, workers);
    // A knob column sorted by goes away once its knob no longer differs: sort as by default
    // meanwhile, keeping the choice for when it comes back.
    const sort = head.shownSort(knobs, metric);
    head.markSorted(sort);
    const all = [...state.runs.values()];
    const shown = all.filter((r) => runShown(r, focus.hide));
    const main = sortRuns(shown.filter((r) => !isCollapsible(r)), sort, metric);
    const folded = shown.filter((r) => isCollapsible(r)).sort((a, b) => a.id - b.id);
    const rowContext: RowContext = {
      state, knobs, metric, disconnected: () => ctx.disconnected(), busy: ops.busy, armed: ops.armed,
    };
    for (const run of all) {
      let row = rows.get(run.id);
      if (!row) {
        row = makeRow(run, { knobs, lineage, workers }, actions);
        rows.set(run.id, row);
      }
      updateRow(row, run, rowContext);
    }
    groupCell.textContent = groupText(folded, groupOpen);
    const held = renderOrder(main, folded);
    filters.showHidden(all.length - shown.length, held);
  }

  /** Rebuild the header when its columns change, and the rows when theirs do. */
  function renderColumns(knobs: string[], metric: string | null, lineage: boolean, workers: boolean): void {
    const key = JSON.stringify([knobs, metric, lineage, workers]);
    // The eval metric only names a header: its first value must not rebuild the rows, or the
    // button under the pointer is replaced between press and release.
    const rowsKey = JSON.stringify([knobs, lineage, workers]);
    if (key === columnsKey) return;
    columnsKey = key;
    groupCell.colSpan = head.build({ knobs, metric, lineage, workers });
    if (rowsKey !== rowColumnsKey) {
      rowColumnsKey = rowsKey;
      rows.clear();
      tbody.replaceChildren();
      shownOrder = "";
    }
  }

  /** Put the rows in order (or keep the order held); true when the shown order is held. */
  function renderOrder(main: number[], folded: RunState[]): boolean {
    const hold = !reorderNow && (pointerInTable || ops.anyArmed());
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
    return held;
  }

  function restore(sort: SortKey, open: boolean): void {
    head.restore(sort);
    groupOpen = open;
    filters.restore();
  }

  return {
    filterBox: filters.box,
    wrap: tableWrap,
    render,
    highlight: (runId) => {
      for (const [rid, row] of rows) row.tr.classList.toggle("rf-hot", rid === runId);
    },
    sortKey: head.sortKey,
    groupOpen: () => groupOpen,
    restore,
    dispose: () => {
      ops.dispose();
      stopWatching();
    },
  };
}

/** The folded group's row: how many pruned and deleted runs it holds, and what a click does. */
function groupText(folded: RunState[], open: boolean): string {
  const nPruned = folded.filter((r) => isPruned(r)).length;
  const nDeleted = folded.length - nPruned;
  const parts = [nPruned ? `${nPruned} pruned` : "", nDeleted ? `${nDeleted} deleted` : ""].filter(Boolean).join(" · ");
  return `${open ? "▾" : "▸"} ${parts} (click to ${open ? "fold" : "show"})`;
}
