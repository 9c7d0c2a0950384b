import type { DrawSeries } from "./canvaschart";
import type { PanelState, TimeSplit } from "./state";
import { isCollapsible, runShown, type StatusFilters } from "./table";
import type { TimeSplitFigure, TraceSpec } from "./chartplan";

/**
 * Choices that keep the charts readable and cheap at AutoML scale (dozens of runs). Pure functions,
 * so vitest checks them without a DOM.
 */

/** Up to this many shown runs, every eval curve shows its markers (one per chunk). */
export const EVAL_MARKER_RUNS = 12;

/**
 * A curve's markers, in Plotly's words (`mode`). Train curves have a point per step: lines only. Eval curves mark their
 * evaluations while few runs are shown; past EVAL_MARKER_RUNS only the hovered or pinned runs do.
 * (`shown` = 0 is a trace being created: markers until the emphasis pass decides.)
 */
export function evalMarkers(split: "train" | "eval", shown: number, focused: boolean): "lines" | "lines+markers" {
  if (split === "train") return "lines";
  return focused || shown <= EVAL_MARKER_RUNS ? "lines+markers" : "lines";
}

/** Minimum ms between two redraws of the engine time split (one bar row per run). */
export function timeSplitInterval(runs: number): number {
  return Math.max(2000, Math.min(12000, 250 * runs));
}

/** How one run's curve is drawn now, from the table's hover and pins, its swatch and the filters. */
export interface SeriesStyle {
  shown: boolean;
  focused: boolean;
  opacity: number;
  width: number;
  markers: boolean;
}

/**
 * The emphasis of each drawn run (`order`: the chart's runs, in trace order). With a run hovered
 * in the table or pinned, those are drawn thick and on top and every other run fades; without,
 * pruned and deleted runs are fainter. Hidden runs (swatch or status filter) are not drawn.
 */
export function seriesStyles(
  state: PanelState, order: readonly number[], split: "train" | "eval",
  focus: ReadonlySet<number>, hidden: ReadonlySet<number>, hide: StatusFilters,
): SeriesStyle[] {
  const shownFlags = order.map((id) => {
    const run = state.runs.get(id);
    return !!run && runShown(run, hide) && !hidden.has(id);
  });
  const shown = shownFlags.filter(Boolean).length;
  // Only a shown run can take the focus: a pinned run hidden since (its row too, so it cannot be
  // unpinned) would otherwise fade every curve left on the chart.
  const anyFocus = order.some((id, i) => shownFlags[i] && focus.has(id));
  return order.map((id, i) => {
    const run = state.runs.get(id);
    const focused = anyFocus && shownFlags[i] && focus.has(id);
    const faded = run ? isCollapsible(run) : false;
    return {
      shown: shownFlags[i],
      focused,
      opacity: anyFocus ? (focused ? 1 : 0.12) : faded ? 0.35 : 1,
      width: focused ? 3 : 1.5,
      markers: evalMarkers(split, shown, focused) === "lines+markers",
    };
  });
}

/** A chart's curves as the canvas draws them: each trace with its run's emphasis. */
export function drawSeries(traces: readonly TraceSpec[], styles: readonly SeriesStyle[]): DrawSeries[] {
  return traces.map((t, i) => ({
    runId: t.runId, name: t.name, title: t.title, color: t.color, dash: t.dash, x: t.x, y: t.y,
    ...(styles[i] ?? { shown: true, focused: false, opacity: t.faded ? 0.35 : 1, width: 1.5, markers: false }),
  }));
}

export const TIME_COLORS: Record<keyof TimeSplit, string> = {
  train: "#1a7f37", eval: "#0b61a4", generate: "#8250df", swap: "#b58900", other: "#8a8a8a",
};

/** One row of the time split's stacked bars: widths in % of the longest row, which fills the track. */
export interface TimeBar {
  label: string;
  runId: number | null;
  total: number;
  widthPct: number;
  segments: { category: keyof TimeSplit; seconds: number; pct: number }[];
}

/**
 * The engine time split as stacked bars on one scale (the "all runs" row is the longest): each
 * segment's share of its own bar, and the bar's length relative to the longest one.
 */
export function timeBars(fig: TimeSplitFigure): TimeBar[] {
  const totals = fig.rows.map((_, i) => fig.categories.reduce((sum, c) => sum + Math.max(0, fig.values[c][i] ?? 0), 0));
  const longest = Math.max(0, ...totals);
  return fig.rows.map((label, i) => {
    const total = totals[i];
    const m = /^run (\d+)$/.exec(label);
    return {
      label,
      runId: m ? Number(m[1]) : null,
      total,
      widthPct: longest > 0 ? (100 * total) / longest : 0,
      segments: fig.categories.map((category) => {
        const seconds = Math.max(0, fig.values[category][i] ?? 0);
        return { category, seconds, pct: total > 0 ? (100 * seconds) / total : 0 };
      }),
    };
  });
}
