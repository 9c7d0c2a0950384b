// The panel's button rules (legalOps in src/table.ts) against the one table of op rules the
// Python side applies (rapidfire_nb/engine/ops_rules.json: the facade, the op queue and the
// controller). The file is read from the repository, not copied.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import type { RunStatus } from "../src/state";
import { legalOps, type LegalOps } from "../src/table";

const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const RULES = JSON.parse(readFileSync(join(REPO, "rapidfire_nb", "engine", "ops_rules.json"), "utf8")) as {
  statuses: string[];
  ops: Record<string, { allowed: string[]; leaves: string | null; refusal: string }>;
};

describe("op rules: the panel agrees with engine/ops_rules.json", () => {
  it("the panel has a button for every op in the table, and no other", () => {
    expect(Object.keys(legalOps("pending")).sort()).toEqual(Object.keys(RULES.ops).sort());
  });

  for (const status of RULES.statuses) {
    it(`a ${status} run: the buttons enabled are the ops the table allows`, () => {
      const legal = legalOps(status as RunStatus);
      const expected: Record<string, boolean> = {};
      for (const [op, rule] of Object.entries(RULES.ops)) expected[op] = rule.allowed.includes(status);
      expect(legal as unknown as Record<string, boolean>).toEqual(expected);
    });
  }

  it("every status the table allows an op for is a status the table knows", () => {
    for (const rule of Object.values(RULES.ops)) {
      for (const s of rule.allowed) expect(RULES.statuses).toContain(s);
      if (rule.leaves !== null) expect(RULES.statuses).toContain(rule.leaves);
    }
  });

  it("the table disables some op for some status (a rule that allows everything checks nothing)", () => {
    const some = RULES.statuses.some((s) => Object.values(legalOps(s as RunStatus) as LegalOps).includes(false));
    expect(some).toBe(true);
  });
});
