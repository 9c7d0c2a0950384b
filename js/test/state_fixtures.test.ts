// The view's fold (src/state.ts) against the fixtures Python's reducer is tested with
// (tests/engine/test_state.py): the same recorded event logs, the same expected tables, and the same event
// schema (rapidfire_nb/engine/events_schema.json). Files are read from the repository, not copied.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createState, ingest, VIEW_RUN_FIELDS, VIEW_TABLE_FIELDS, viewTable, type WireEvent } from "../src/state";

const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const FIXTURES = join(REPO, "tests", "fixtures", "events");
const SCHEMA = JSON.parse(readFileSync(join(REPO, "rapidfire_nb", "engine", "events_schema.json"), "utf8"));
const NAMES = readdirSync(FIXTURES).filter((f) => f.endsWith(".jsonl")).map((f) => f.slice(0, -".jsonl".length)).sort();

// Python writes non-finite floats as bare NaN / Infinity; the wire (to_json) sends them as null.
function readLog(name: string): WireEvent[] {
  return readFileSync(join(FIXTURES, `${name}.jsonl`), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line.replace(/(?<=[:[,]\s*)-?(NaN|Infinity)(?=\s*[,}\]])/g, "null")));
}

type Json = Record<string, unknown>;

function expected(name: string): Json {
  return JSON.parse(readFileSync(join(FIXTURES, `${name}.table.json`), "utf8"));
}

const TYPE_CHECKS: Record<string, (v: unknown) => boolean> = {
  int: (v) => typeof v === "number" && Number.isInteger(v),
  number: (v) => typeof v === "number",
  string: (v) => typeof v === "string",
  bool: (v) => typeof v === "boolean",
  null: (v) => v === null,
  object: (v) => typeof v === "object" && v !== null && !Array.isArray(v),
  array: (v) => Array.isArray(v),
};

/** What in `ev` breaks the schema; the same rules as check_event in engine/state.py. */
function checkEvent(ev: Record<string, unknown>): string[] {
  const spec = SCHEMA.events[ev.type as string];
  if (!spec) return [`unknown event type ${JSON.stringify(ev.type)}`];
  const problems: string[] = [];
  const fields = { ...SCHEMA.common, ...spec.fields } as Record<string, { type: string[]; required?: boolean; enum?: unknown[] }>;
  for (const [name, field] of Object.entries(fields)) {
    if (!(name in ev)) {
      if (field.required) problems.push(`${ev.type}: missing '${name}'`);
      continue;
    }
    const value = ev[name];
    // a NaN read back as null is a number on the Python side
    const ok = field.type.some((t) => TYPE_CHECKS[t](value));
    if (!ok) problems.push(`${ev.type}.${name}: ${JSON.stringify(value)} is not ${field.type.join("/")}`);
    else if (field.enum && !field.enum.includes(value)) problems.push(`${ev.type}.${name}: not one of ${field.enum}`);
  }
  return problems;
}

function project(table: Json): Json {
  const out: Record<string, unknown> = {};
  for (const k of VIEW_TABLE_FIELDS) out[k] = table[k];
  const runs: Record<string, unknown> = {};
  for (const [id, run] of Object.entries(table.runs as Record<string, Record<string, unknown>>)) {
    const r: Record<string, unknown> = {};
    for (const k of VIEW_RUN_FIELDS) r[k] = run[k];
    runs[id] = r;
  }
  out.runs = runs;
  return out;
}

/** Plain JSON, as Python's json.dumps writes the expected table (times summed the same way). */
function asJson(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v));
}

describe("shared fixtures", () => {
  it("covers every recorded scenario", () => {
    expect(NAMES).toEqual(["clone_delete", "crash_resume", "dpo", "failed", "grpo", "pruned", "ray_workers",
      "sft_basic", "stop_resume", "suggested"]);
  });

  for (const name of NAMES) {
    it(`${name}: every event fits events_schema.json`, () => {
      const problems = readLog(name).flatMap((ev) => checkEvent(ev).map((p) => `seq ${ev.seq}: ${p}`));
      expect(problems).toEqual([]);
    });

    it(`${name}: the fold equals Python's expected table`, () => {
      const state = createState();
      const result = ingest(state, readLog(name));
      expect(result.invalid).toBe(0);
      expect(asJson(viewTable(state))).toEqual(project(expected(name)));
    });

    it(`${name}: the wire form (as _panel_protocol.wire_event trims it) folds to the same table`, () => {
      // What the view really gets: run_created without its config, run_status with has_error
      // instead of the traceback text.
      const wire = readLog(name).map((ev) => {
        const out: WireEvent = { ...ev };
        if (out.type === "run_created") delete out.config;
        if (out.type === "run_status") {
          out.has_error = typeof out.error === "string" && out.error.length > 0;
          delete out.error;
        }
        return out;
      });
      const state = createState();
      ingest(state, wire);
      expect(asJson(viewTable(state))).toEqual(project(expected(name)));
    });

    it(`${name}: folding in small batches, shuffled within each, gives the same table`, () => {
      const events = readLog(name);
      const state = createState();
      for (let i = 0; i < events.length; i += 3) {
        const batch = events.slice(i, i + 5).reverse();   // overlapping and out of order: duplicates too
        ingest(state, batch);
      }
      expect(asJson(viewTable(state))).toEqual(project(expected(name)));
    });
  }

  it("the schema check names what is wrong", () => {
    const metric = readLog("sft_basic").find((e) => e.type === "metric")!;
    expect(checkEvent(metric)).toEqual([]);
    expect(checkEvent({ ...metric, samples_seen: "8" })).toEqual(['metric.samples_seen: "8" is not int']);
    const { split: _drop, ...noSplit } = metric;
    expect(checkEvent(noSplit)).toEqual(["metric: missing 'split'"]);
  });

  it("train curves are plotted against samples seen, like eval curves and the trackers", () => {
    const events = readLog("sft_basic");
    const state = createState();
    ingest(state, events);
    const run1 = state.runs.get(1)!;
    const want = events.filter((e) => e.type === "metric" && e.run_id === 1 && e.split === "train")
      .map((e) => e.samples_seen);
    expect(run1.train.loss.x).toEqual(want);
    expect(want[want.length - 1]).toBeGreaterThan(run1.completedSteps);   // not the optimizer step
  });
});
