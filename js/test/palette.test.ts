// One palette, one dash rule and one downsampling rule for the panel and the plotly figures:
// src/palette.ts and src/chartplan.ts must hold what rapidfire_nb/report/palette.json says, and its LTTB must pick the
// points the Python port picks on shared fixtures (tests/fixtures/report/downsample.json, written
// by make_downsample.py beside it; tests/report/test_report.py checks that file is current).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { PALETTE, runColor, runDash } from "../src/palette";
import {
  drawnPoints,
  MAX_TRACE_POINTS,
  MIN_TRACE_POINTS,
  POINT_BUDGET,
  tracePointLimit,
} from "../src/chartplan";

const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const RULES = JSON.parse(readFileSync(join(REPO, "rapidfire_nb", "report", "palette.json"), "utf8"));
const FIXTURE = JSON.parse(readFileSync(join(REPO, "tests", "fixtures", "report", "downsample.json"), "utf8"));

interface Case {
  x: number[];
  y: (number | null)[];
  max_points: number;
  drawn: { x: number[]; y: (number | null)[]; sampled: boolean };
}

describe("palette.json is the panel's palette", () => {
  it("holds the same colours in the same order", () => {
    expect(RULES.palette).toEqual([...PALETTE]);
  });

  it("holds the same point budget", () => {
    expect([RULES.point_budget, RULES.min_trace_points, RULES.max_trace_points]).toEqual([
      POINT_BUDGET,
      MIN_TRACE_POINTS,
      MAX_TRACE_POINTS,
    ]);
  });

  it("gives every run the colour and dash the Python figures give it", () => {
    expect(FIXTURE.runs.length).toBeGreaterThan(4 * PALETTE.length);
    for (const r of FIXTURE.runs as { run_id: number; color: string; dash: string }[]) {
      expect([r.run_id, runColor(r.run_id), runDash(r.run_id)]).toEqual([r.run_id, r.color, r.dash]);
    }
    // the dash names come from palette.json in the order the panel cycles them
    const dashes = [1, 25, 49, 73].map(runDash);
    expect(dashes).toEqual(RULES.dashes);
  });
});

describe("the figures downsample as the panel does", () => {
  it("shares a chart's budget between its curves the same way", () => {
    for (const [traces, limit] of FIXTURE.trace_point_limit as [number, number][]) {
      expect([traces, tracePointLimit(traces)]).toEqual([traces, limit]);
    }
  });

  it("keeps the same points of every fixture series", () => {
    const cases = FIXTURE.series as Case[];
    expect(cases.some((c) => c.drawn.sampled)).toBe(true);
    expect(cases.some((c) => !c.drawn.sampled)).toBe(true);
    for (const c of cases) {
      const d = drawnPoints({ x: c.x, y: c.y }, null, c.max_points);
      expect({ n: c.x.length, max: c.max_points, x: d.x, y: d.y, sampled: d.sampled }).toEqual({
        n: c.x.length,
        max: c.max_points,
        ...c.drawn,
      });
    }
  });
});
