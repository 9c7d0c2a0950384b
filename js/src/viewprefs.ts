/**
 * What the user set up in a panel view (status filters, sort order, the folded group, the chosen
 * metrics), remembered per experiment so that a re-rendered view (the output re-displayed, the
 * notebook re-opened, the page reloaded) comes back as the user left it.
 *
 * Kept in localStorage when the front end allows it (some sandboxed iframes throw on access), and
 * always in this module's memory, which outlives a single view within one page. What is read back
 * is checked field by field: another version of the panel, or a user, may have left anything there.
 */
import type { SortColumn, SortKey, StatusFilters } from "./table";
import { X_AXES, type XAxis } from "./chartplan";

export interface ViewPrefs {
  hide: StatusFilters;
  sort: SortKey;
  groupOpen: boolean;
  /** The metric picked in each chart's menu (null: the chart's default). */
  metrics: { train: string | null; eval: string | null };
  /** How the curves are drawn: smoothing weight (0 to 0.99), log y, the x axis. */
  curves: { smoothing: number; logY: boolean; xAxis: XAxis };
}

/** The small part of the Web Storage API used here (a test passes a Map-backed one). */
export interface PrefStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

/** The smoothing slider's top (TensorBoard's is 0.999; past 0.99 a short curve is a flat line). */
export const MAX_SMOOTHING = 0.99;
const SORT_COLUMNS: SortColumn[] = ["auto", "id", "status", "progress", "loss", "eval"];
const PREFIX = "rapidfire-panel-view:";
const memory = new Map<string, string>();

export function defaultPrefs(): ViewPrefs {
  return {
    hide: { stopped: false, pruned: false, deleted: false },
    sort: { column: "auto", descending: false },
    groupOpen: false,
    metrics: { train: null, eval: null },
    curves: { smoothing: 0, logY: false, xAxis: "samples" },
  };
}

/** One key per experiment folder (the name alone when no path is known). */
export function prefsKey(path: string | null, name: string | null): string | null {
  const id = path || name;
  return id ? PREFIX + id : null;
}

function browserStore(): PrefStore | null {
  try {
    const s = globalThis.localStorage;
    return s && typeof s.getItem === "function" ? s : null;
  } catch {
    return null; // access denied (sandboxed iframe, storage disabled)
  }
}

/** Stored prefs checked field by field; whatever is missing or malformed keeps its default. */
export function parsePrefs(raw: string | null): ViewPrefs | null {
  if (raw === null) return null;
  let data: unknown;
  try {
    data = JSON.parse(raw);
  } catch {
    return null;
  }
  if (!data || typeof data !== "object" || Array.isArray(data)) return null;
  const d = data as Record<string, unknown>;
  const out = defaultPrefs();
  const hide = d.hide as Record<string, unknown> | undefined;
  if (hide && typeof hide === "object") {
    for (const k of ["stopped", "pruned", "deleted"] as (keyof StatusFilters)[]) {
      if (typeof hide[k] === "boolean") out.hide[k] = hide[k] as boolean;
    }
  }
  const sort = d.sort as Record<string, unknown> | undefined;
  const known = (c: unknown) => typeof c === "string"
    && (SORT_COLUMNS.includes(c as SortColumn) || (c.startsWith("knob:") && c.length > "knob:".length));
  if (sort && typeof sort === "object" && known(sort.column) && typeof sort.descending === "boolean") {
    out.sort = { column: sort.column as SortColumn, descending: sort.descending };
  }
  if (typeof d.groupOpen === "boolean") out.groupOpen = d.groupOpen;
  const metrics = d.metrics as Record<string, unknown> | undefined;
  if (metrics && typeof metrics === "object") {
    for (const k of ["train", "eval"] as const) {
      const m = metrics[k];
      if (typeof m === "string" && m.length > 0 && m.length <= 200) out.metrics[k] = m;
    }
  }
  const curves = d.curves as Record<string, unknown> | undefined;
  if (curves && typeof curves === "object") {
    const w = curves.smoothing;
    if (typeof w === "number" && Number.isFinite(w) && w >= 0 && w <= MAX_SMOOTHING) out.curves.smoothing = w;
    if (typeof curves.logY === "boolean") out.curves.logY = curves.logY;
    if (typeof curves.xAxis === "string" && (X_AXES as string[]).includes(curves.xAxis)) out.curves.xAxis = curves.xAxis as XAxis;
  }
  return out;
}

export function loadPrefs(key: string | null, store: PrefStore | null = browserStore()): ViewPrefs | null {
  if (key === null) return null;
  let raw: string | null = null;
  try {
    raw = store?.getItem(key) ?? null;
  } catch {
    raw = null;
  }
  return parsePrefs(raw ?? memory.get(key) ?? null);
}

export function savePrefs(key: string | null, prefs: ViewPrefs, store: PrefStore | null = browserStore()): void {
  if (key === null) return;
  const text = JSON.stringify(prefs);
  memory.set(key, text);
  try {
    store?.setItem(key, text);
  } catch {
    // quota or access denied: the in-page memory still has it
  }
}
