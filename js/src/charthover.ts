/**
 * A curve chart's hover: what the pointer is on (a pruning rung's cross, else every shown run's
 * value at the pointer's x, the nearest curve named) and the label that shows it.
 */
import {
  fmtHover,
  fromPx,
  hoverRows,
  nearestPoint,
  rungAxisY,
  toPx,
  type DrawSeries,
  type HoverRow,
  type RungMark,
  type Scales,
} from "./chartgeometry";

/** How near (CSS pixels) the pointer must be to a curve to name it, and to the plot to hover at all. */
const HOVER_PX = 20;
const RUNG_HOVER_PX = 9;
/** The multi-run hover lists this many runs, then "+N more runs". */
const MAX_HOVER_ROWS = 16;

/** What a draw left for the hover to look up. */
export interface HoverScene {
  scales: Scales | null;
  /** The series as given (their logged values), and in axis units with the line drawn on top. */
  series: readonly DrawSeries[];
  axisSeries: readonly DrawSeries[];
  mainY: readonly (number | null)[][];
  /** Each series' smoothing weight (0: drawn raw). */
  smoothW: readonly number[];
  rungs: readonly RungMark[];
  logY: boolean;
  /** The smoothing the curves were drawn with (the hover shows the smoothed value second). */
  smoothed: (y: readonly (number | null)[], weight: number) => (number | null)[];
  /** Whether the hover lists the lowest value first (asked only when runs are listed). */
  lowerFirst: () => boolean;
}

/** What the pointer is on: a rung's reason (`lines`) or the runs' values (`rows`); neither: nothing. */
export interface HoverHit {
  /** The run named (its curve nearest the pointer, or the rung's run); null: none. */
  runId: number | null;
  lines: string[];
  rows: HoverRow[];
  /** The label's border colour ("" when nothing is hit). */
  color: string;
  /** Where the label goes beside (the pointer, or the rung's cross). */
  at: [number, number];
}

export function hoverHit(scene: HoverScene, px: number, py: number): HoverHit {
  const { scales } = scene;
  const inside = scales !== null && px >= scales.box.left - HOVER_PX && px <= scales.box.left + scales.box.width + HOVER_PX
    && py >= scales.box.top - HOVER_PX && py <= scales.box.top + scales.box.height + HOVER_PX;
  const hit: HoverHit = { runId: null, lines: [], rows: [], color: "", at: [px, py] };
  if (scales === null || !inside) return hit;
  let rung: RungMark | null = null;
  let rungDist = RUNG_HOVER_PX;
  for (const r of scene.rungs) {
    const ry = rungAxisY(r.y, scene.logY);
    if (ry === null) continue;
    const [rx, rpy] = toPx(scales, r.x, ry);
    const d = Math.hypot(rx - px, rpy - py);
    if (d <= rungDist) {
      rung = r;
      rungDist = d;
      hit.at = [rx, rpy];
    }
  }
  if (rung) {
    hit.lines = [rung.text];
    hit.color = rung.color;
    hit.runId = rung.runId;
    return hit;
  }
  // Every shown run's value at the pointer's x, TensorBoard-style; the curve nearest the
  // pointer (if any within reach) is the one named in the table and drawn bold here.
  const { series, mainY, smoothW } = scene;
  const main = scene.axisSeries.map((s, i) => ({ ...s, y: mainY[i] }));
  const near = nearestPoint(main, scales, px, py, HOVER_PX);
  const x = fromPx(scales, px, py)[0];
  // The logged values (where the curve is drawn): a smoothed value alone misreads a run
  // (1.087 shown where it logged 0.642), so it only comes second.
  const rawY = series.map((s, i) => s.y.map((v, k) => (mainY[i][k] === null ? null : v)));
  const smoothY = series.map((s, i) => (smoothW[i] > 0 ? scene.smoothed(s.y, smoothW[i]) : null));
  hit.rows = hoverRows(series, rawY, x, scene.lowerFirst(), smoothY);
  if (near !== null) {
    const s = series[near.series];
    hit.runId = s.runId;
    hit.color = s.color;
  }
  return hit;
}

function h(tag: string, cls: string, text: string): HTMLElement {
  const el = document.createElement(tag);
  el.className = cls;
  el.textContent = text;
  return el;
}

/** Where the label is drawn and what it names. */
export interface TipPlace {
  xLabel: string;
  /** The series as given: a run's whole config is its `title`. */
  series: readonly DrawSeries[];
  /** The chart's size in CSS pixels: the label stays inside it. */
  width: number;
  height: number;
}

/** Show `hit` in the label `tip` (hidden when it hits nothing); the label's rows as text. */
export function showTip(tip: HTMLDivElement, hit: HoverHit, place: TipPlace): string[] {
  const { runId, lines, rows, at } = hit;
  let { color } = hit;
  if (lines.length === 0 && rows.length === 0) {
    tip.style.display = "none";
    return [];
  }
  let text: string[];
  if (rows.length) {
    const shown = rows.slice(0, MAX_HOVER_ROWS);
    const head = h("div", "rf-tip-head", `${place.xLabel} ${fmtHover(rows.find((r) => r.runId === runId)?.x ?? rows[0].x)}`);
    const body = shown.map((r) => {
      const row = h("div", r.runId === runId ? "rf-tip-row rf-tip-hit" : "rf-tip-row", "");
      const key = h("span", "rf-tip-key", "\u25A0");
      key.style.color = r.color;
      const name = h("span", "rf-tip-name", r.name);
      const title = place.series.find((s) => s.runId === r.runId)?.title;
      if (title) name.title = title;
      row.append(key, name, h("span", "rf-tip-value", fmtHover(r.value)),
        ...(r.smoothed !== null ? [h("span", "rf-tip-smoothed", `smoothed ${fmtHover(r.smoothed)}`)] : []));
      return row;
    });
    // The hovered run's whole config: its short name shows two knobs at most.
    const hitTitle = place.series.find((s) => s.runId === runId)?.title;
    const full = hitTitle && hitTitle !== rows.find((r) => r.runId === runId)?.name
      ? [h("div", "rf-tip-full", hitTitle)] : [];
    const more = rows.length > shown.length ? [h("div", "rf-tip-more", `+${rows.length - shown.length} more runs`)] : [];
    tip.replaceChildren(head, ...full, ...body, ...more);
    tip.classList.remove("rf-tip-wrap");
    tip.classList.add("rf-tip-multi");
    text = [head.textContent ?? "", ...shown.map((r) => `${r.name}: ${fmtHover(r.value)}`
      + `${r.smoothed !== null ? ` (smoothed ${fmtHover(r.smoothed)})` : ""}`)];
    if (color === "") color = "rgba(128,128,128,0.6)";
  } else {
    tip.replaceChildren(...lines.flatMap((l, i) => (i ? [document.createElement("br"), l] : [l])));
    // A pruner's reason wraps inside the chart.
    tip.classList.add("rf-tip-wrap");
    tip.classList.remove("rf-tip-multi");
    text = [...lines];
  }
  tip.style.borderColor = color;
  tip.style.display = "";
  tip.style.left = "0px";
  // Beside the pointer (to its left in the right half), then clamped inside the chart by the
  // label's measured size: one layout read per hover change, not per draw.
  const w = tip.offsetWidth;
  const hgt = tip.offsetHeight;
  const want = at[0] > place.width / 2 ? at[0] - 14 - w : at[0] + 14;
  tip.style.left = `${Math.round(Math.max(0, Math.min(place.width - w, want)))}px`;
  tip.style.right = "";
  tip.style.top = `${Math.round(Math.max(0, Math.min(place.height - hgt, at[1] - 20)))}px`;
  return text;
}
