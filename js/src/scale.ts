/**
 * Choices that keep the charts readable and cheap at AutoML scale (dozens of runs). Pure functions,
 * so vitest checks them without a DOM.
 */

/** Up to this many shown runs, every eval curve shows its markers (one per chunk). */
export const EVAL_MARKER_RUNS = 12;

/**
 * A trace's plotly `mode`. Train curves have a point per step: lines only. Eval curves mark their
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
