// Review of the canvas charts (s5_p, issue 20): regressions found by a hostile user, as failing
// tests of the pure geometry (see /work/notes/review_s5_p.md; each `it` names its finding).
// All six fail on main 470a1f5 (findings F4, F5, F8, F9, F10, F11).
import { describe, expect, it } from "vitest";
import { extents, fmtTick, nearestPoint, niceTicks, type DrawSeries } from "../src/canvaschart";
import { seriesStyles } from "../src/scale";
import { createState, ingest, runColor, runDash } from "../src/state";

function series(runId: number, x: number[], y: (number | null)[], extra: Partial<DrawSeries> = {}): DrawSeries {
  return {
    runId, name: `run ${runId}`, color: runColor(runId), dash: runDash(runId), x, y,
    shown: true, focused: false, opacity: 1, width: 1.5, markers: false, ...extra,
  };
}

/** The y tick labels a draw of these series would write (same calls as CanvasChart.draw at 260 px). */
function yLabels(ys: number[]): string[] {
  const e = extents([series(1, ys.map((_, i) => 8 * i), ys)], null, null)!;
  const t = niceTicks(e.y[0], e.y[1], Math.floor(260 / 40));
  return t.ticks.map((v) => fmtTick(v, t.step));
}

describe("review s5_p: axis labels", () => {
  it("F5: a near-flat metric (ln 2 +- 1e-7) gets distinct y tick labels", () => {
    const labels = yLabels([0.6931471, 0.6931473, 0.6931472]);
    expect(labels.length).toBeGreaterThan(2);
    // main: five times "6.931e-1"
    expect(new Set(labels).size).toBe(labels.length);
  });

  it("F9: a diverged run's 1e30 loss labels the axis without 'e+23M'", () => {
    const labels = yLabels([0.5, 1e30, 0.4]);
    // main: "2e+23M", "4e+23M", ...: the M suffix on an exponent
    for (const l of labels) expect(l).not.toMatch(/e[+-]?\d+[kM]$/);
  });
});

describe("review s5_p: zoom", () => {
  it("F8: an x zoom inside a run's NaN gap fits y to the points just outside it, not 0..1", () => {
    // Drawn points of a zoomed range: one beyond each edge (planChart), none inside (all NaN -> null).
    const s = series(1, [23_992, 24_000, 27_200, 27_208], [0.52, null, null, 0.51]);
    const e = extents([s], [24_500, 26_500], null)!;
    // main: y = [0, 1] although every drawn line is at 0.51-0.52
    expect(e.y[0]).toBeGreaterThan(0.4);
    expect(e.y[1]).toBeLessThan(0.6);
  });
});

describe("review s5_p: hover", () => {
  it("F10: two runs on the same points: the hover names the run drawn on top (the later one)", () => {
    const xs = [0, 8, 16];
    const ys = [1, 0.9, 0.8];
    // Drawn in series order (focused last): series 1 is painted over series 0.
    const all = [series(1, xs, ys), series(2, xs, ys)];
    const scales = { x: [0, 16] as [number, number], y: [0.7, 1.1] as [number, number], box: { left: 0, top: 0, width: 400, height: 200 } };
    const hit = nearestPoint(all, scales, 200, 100, 20)!;
    // main: series 0 (run 1), whose colour is hidden under run 2's line
    expect(all[hit.series].runId).toBe(2);
  });
});

describe("review s5_p: hover outside the plot", () => {
  it("F11: a point outside a y zoom (clipped, not drawn) is not hovered", () => {
    // y zoomed to 0.5..0.6; run 1's point at 0.605 is 10 px above the plot's top: not drawn.
    const s = [series(1, [0, 8, 16], [0.55, 0.605, 0.55])];
    const scales = { x: [0, 16] as [number, number], y: [0.5, 0.6] as [number, number], box: { left: 40, top: 10, width: 400, height: 200 } };
    // the pointer on the plot's top edge above x = 8
    const hit = nearestPoint(s, scales, 240, 12, 20);
    // main: hit, the label shows "loss 0.605" for a point the user cannot see
    expect(hit === null || s[hit.series].y[hit.index] !== 0.605).toBe(true);
  });
});

describe("review s5_p: emphasis", () => {
  it("F4: a pinned run hidden by a status filter no longer fades every shown run", () => {
    const state = createState();
    let seq = 0;
    const ev = (e: Record<string, unknown>) => ({ seq: ++seq, time: seq, ...e });
    const events = [];
    for (let id = 1; id <= 3; id++) {
      events.push(ev({ type: "run_created", run_id: id, trainer_type: "SFT", knobs: { lr: id }, total_steps: 100, num_chunks: 4 }));
      events.push(ev({ type: "metric", run_id: id, split: "train", step: 1, samples_seen: 8, metrics: { loss: id } }));
    }
    events.push(ev({ type: "run_status", run_id: 3, status: "stopped", reason: "stopped by user" }));
    ingest(state, events);
    // Run 3 pinned, then "hide stopped": its row and curve are gone, so it cannot be unpinned.
    const styles = seriesStyles(state, [1, 2, 3], "train", new Set([3]), new Set(), { stopped: true, pruned: false, deleted: false });
    expect(styles[2].shown).toBe(false);
    // main: runs 1 and 2 at opacity 0.12, nothing emphasized
    expect(styles.slice(0, 2).map((s) => s.opacity)).toEqual([1, 1]);
  });
});
