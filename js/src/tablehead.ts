/**
 * The run table's header: its columns (rebuilt when the knobs that differ, the eval metric, the
 * lineage or the workers change) and the sort a click on a header chooses.
 */
import { h } from "./dom";
import { readableKnob, readableMetric } from "./format";
import { lowerIsBetter, type PanelState } from "./state";
import { effectiveSort, knobColumns, knobSort, type SortColumn, type SortKey } from "./table";

export interface TableHeadContext {
  state: PanelState;
  /** The eval chart's metric: the table's eval column and its sort. */
  metric: () => string | null;
  persistPrefs: () => void;
  scheduleRender: (what: { table?: boolean }) => void;
  /** A header was clicked: the next render reorders the rows, pointer over the table or not. */
  reorderNow: () => void;
}

/** What the header shows: the knob columns and the optional ones. */
export interface HeadColumns {
  knobs: string[];
  metric: string | null;
  lineage: boolean;
  workers: boolean;
}

export interface TableHead {
  /** Build the header row for these columns; the number of columns. */
  build(columns: HeadColumns): number;
  /** The sort the table shows: a knob sort whose column is gone reads as the default. */
  shownSort(knobs: string[], metric: string | null): SortKey;
  /** Mark the sorted column and its direction. */
  markSorted(sort: SortKey): void;
  /** The sort chosen (kept while its knob column is gone). */
  sortKey(): SortKey;
  restore(sort: SortKey): void;
}

export function createTableHead(thead: HTMLTableSectionElement, ctx: TableHeadContext): TableHead {
  const { state } = ctx;
  let sortKey: SortKey = { column: "auto", descending: false };
  const sortHeads = new Map<SortColumn, HTMLTableCellElement>();

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
    ctx.reorderNow();
    ctx.scheduleRender({ table: true });
  }

  function build({ knobs, metric, lineage, workers }: HeadColumns): number {
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
    return heads.length;
  }

  function markSorted(sort: SortKey): void {
    for (const [col, th] of sortHeads) {
      th.dataset.sorted = col === sort.column ? (sort.descending ? "desc" : "asc") : "";
    }
  }

  return {
    build,
    shownSort,
    markSorted,
    sortKey: () => ({ ...sortKey }),
    restore: (sort) => {
      sortKey = { ...sort };
    },
  };
}
