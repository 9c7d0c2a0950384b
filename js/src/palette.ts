/**
 * Run colours and line dashes, the same in every chart, the table, the time split and the
 * timeline; the status colours of the badges. rapidfire_nb/report/palette.json holds the same
 * values for the plotly figures (js/test/palette.test.ts checks both agree).
 */
import type { RunStatus } from "./state";

/**
 * Run colours: tab10 (less its dark brown), then colours picked greedily for the largest CIEDE2000
 * distance to the others among those readable on both a white page and JupyterLab's dark one: at
 * least 2:1 contrast against white and 3:1 against #212121 (the near-black and light colours of
 * the first palette vanished on one of the two). Any two of the 24 are at least ΔE76 26 apart
 * (js/test/scale.test.ts checks both). Runs past 24 reuse the colours with a dash style, so 96 runs
 * have distinct (colour, dash) pairs; hovering and pinning tell the rest apart.
 */
export const PALETTE = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#87c3a5", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#007878", "#3c784b", "#f032e6", "#7896ff", "#a6761d", "#f99379",
  "#a5694b", "#c2b280", "#b4b4d2", "#e7298a", "#697800", "#b3446c", "#4b5aff", "#e6ab02",
];
export type Dash = "solid" | "dash" | "dot" | "dashdot";
const DASHES: Dash[] = ["solid", "dash", "dot", "dashdot"];

function paletteIndex(runId: number): number {
  return (((runId - 1) % PALETTE.length) + PALETTE.length) % PALETTE.length;
}

/** One colour per run id, the same in every chart, the table and the time split. */
export function runColor(runId: number): string {
  return PALETTE[paletteIndex(runId)];
}

/** The line style that tells apart runs sharing a colour (run 1 and run 25). */
export function runDash(runId: number): Dash {
  const round = Math.floor(Math.max(0, runId - 1) / PALETTE.length);
  return DASHES[round % DASHES.length];
}

/** The dash in words, for titles ("run 25: dashed line"). */
export const DASH_WORDS: Record<Dash, string> = { solid: "solid line", dash: "dashed line", dot: "dotted line", dashdot: "dash-dot line" };

/**
 * A run's key outside the charts: the table swatch's CSS and the time split's glyph. Runs that
 * share a colour (1 and 25) differ by dash on the curves, so the key shows the dash too: a solid
 * square for the first 24, a line sample in the dash pattern (and a matching border) after that.
 */
export function runKey(runId: number): { color: string; dash: Dash; css: Record<string, string>; glyph: string; title: string } {
  const color = runColor(runId);
  const dash = runDash(runId);
  const title = `run ${runId}: ${DASH_WORDS[dash]}`;
  if (dash === "solid") {
    return { color, dash, css: { background: color, borderColor: color, borderStyle: "solid" }, glyph: "■", title };
  }
  const stops: Record<Exclude<Dash, "solid">, string> = {
    dash: `${color} 0 3px, transparent 3px 5px`,
    dot: `${color} 0 1.5px, transparent 1.5px 3px`,
    dashdot: `${color} 0 3px, transparent 3px 4px, ${color} 4px 5px, transparent 5px 6px`,
  };
  return {
    color, dash, title,
    css: {
      background: `repeating-linear-gradient(90deg, ${stops[dash]}) center / 100% 2px no-repeat`,
      borderColor: color,
      borderStyle: dash === "dot" ? "dotted" : "dashed",
    },
    glyph: { dash: "╍╍", dot: "┅┅", dashdot: "╍·" }[dash],
  };
}

export const STATUS_COLORS: Record<RunStatus, string> = {
  pending: "#8a8a8a",
  running: "#1a7f37",
  stopped: "#b58900",
  completed: "#0b61a4",
  failed: "#c62828",
  deleted: "#6e6e6e",
};
