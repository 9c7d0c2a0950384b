/**
 * The line above the run table: the "hide:" filters, how many runs they hide and whether the
 * order is held, and a word when columns lie past the table's visible edge.
 */
import { h } from "./dom";
import type { StatusFilters } from "./table";

export interface FilterBarContext {
  hide: StatusFilters;
  persistPrefs: () => void;
  scheduleRender: (what: { charts?: boolean; table?: boolean }) => void;
}

export interface FilterBar {
  box: HTMLDivElement;
  /** Say how many runs the filters hide and whether the rows hold their order. */
  showHidden(hiddenCount: number, held: boolean): void;
  /** Watch the table's box for columns past its edge; the returned function stops watching. */
  watchOverflow(wrap: HTMLDivElement, table: HTMLTableElement): () => void;
  /** Tick the boxes as `hide` says (after restoring remembered preferences). */
  restore(): void;
}

export function createFilterBar(ctx: FilterBarContext): FilterBar {
  const { hide } = ctx;
  const box = h("div", { class: "rf-filters", "data-testid": "rf-filters" }, ["hide:"]);
  const filterBoxes = new Map<keyof StatusFilters, HTMLInputElement>();
  for (const s of ["stopped", "pruned", "deleted"] as (keyof StatusFilters)[]) {
    const check = h("input", { type: "checkbox", "data-filter": s });
    filterBoxes.set(s, check);
    check.addEventListener("change", () => {
      hide[s] = check.checked;
      ctx.persistPrefs();
      ctx.scheduleRender({ charts: true, table: true });
    });
    box.append(h("label", { title: `hide ${s} runs in the charts and the table` }, [check, ` ${s}`]));
  }
  const hiddenNote = h("span", { class: "rf-note", "data-testid": "rf-hidden-note" });
  box.append(hiddenNote);
  // Columns past the right edge are easy to miss (the sideways scrollbar sits below the rows):
  // say so beside the filters while the table is wider than its box.
  const moreNote = h("span", { class: "rf-note rf-more-cols", "data-testid": "rf-more-columns" });
  moreNote.style.display = "none";
  box.append(moreNote);

  function watchOverflow(wrap: HTMLDivElement, table: HTMLTableElement): () => void {
    const noteOverflow = () => {
      const hidden = wrap.scrollWidth - wrap.clientWidth;
      const atEnd = wrap.scrollLeft >= hidden - 1;
      moreNote.style.display = hidden > 1 ? "" : "none";
      moreNote.textContent = atEnd ? "◂ more columns on the left: scroll the table sideways"
        : "more columns on the right: scroll the table sideways ▸";
    };
    wrap.addEventListener("scroll", noteOverflow, { passive: true });
    const sizes = typeof ResizeObserver === "function" ? new ResizeObserver(noteOverflow) : null;
    sizes?.observe(wrap);
    sizes?.observe(table);
    return () => sizes?.disconnect();
  }

  function showHidden(hiddenCount: number, held: boolean): void {
    const hiddenText = hiddenCount ? `${hiddenCount} run${hiddenCount > 1 ? "s" : ""} hidden` : "";
    const heldText = held ? "order held while the pointer is on the table" : "";
    hiddenNote.textContent = [hiddenText, heldText].filter(Boolean).join(" · ");
  }

  return {
    box,
    showHidden,
    watchOverflow,
    restore: () => {
      for (const [k, check] of filterBoxes) check.checked = hide[k];
    },
  };
}
