// Run short names: the panel's rule (src/names.ts) against the table Python's rule
// (rapidfire_nb/tracking/naming.py) is checked with too (tests/fixtures/run_names.json).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { runName } from "../src/names";

const CASES = JSON.parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), "..", "..", "tests", "fixtures", "run_names.json"), "utf8")) as
  { run_id: number; knobs: Record<string, unknown>; name: string }[];

describe("run names", () => {
  it("reads the shared table (an empty table checks nothing)", () => {
    expect(CASES.length).toBeGreaterThan(5);
  });
  for (const c of CASES) {
    it(`names run ${c.run_id} as Python does: ${c.name}`, () => {
      expect(runName({ id: c.run_id, knobs: c.knobs })).toBe(c.name);
    });
  }
});
