// Odd knob values and names in the table's knob sort, its labels and the clone form: whatever a
// config holds arrives as JSON, where "__proto__" and "constructor" are ordinary keys.
import { describe, expect, it } from "vitest";
import { createState, ingest, type WireEvent } from "../src/state";
import { knobColumns, knobSort, sortRuns } from "../src/table";
import { readableKnob } from "../src/format";
import { knobChanges } from "../src/cloneform";

function withKnobs(knobs: Record<number, Record<string, unknown>>) {
  const state = createState();
  // JSON text, as a comm message arrives: "__proto__" is an own key.
  const evs = JSON.parse(JSON.stringify(Object.entries(knobs).map(([id, k], i) => (
    { seq: i + 1, type: "run_created", run_id: Number(id), knobs: k, total_steps: 10 })))) as WireEvent[];
  ingest(state, evs);
  return state;
}

describe("knob sort, odd values and names", () => {
  it("null / NaN-free JSON values / bools / lists / dicts / long strings sort without throwing, unset last", () => {
    const state = withKnobs({
      1: { v: null }, 2: { v: true }, 3: { v: [8, 16] }, 4: { v: { a: 1 } }, 5: { v: "x".repeat(10000) },
      6: { v: 2 }, 7: {}, 8: { v: -1 }, 9: { v: false },
    });
    const runs = [...state.runs.values()];
    const asc = sortRuns(runs, { column: knobSort("v"), descending: false }, null);
    const desc = sortRuns(runs, { column: knobSort("v"), descending: true }, null);
    expect(asc.slice(0, 2)).toEqual([8, 6]);
    expect(asc.slice(-2)).toEqual([1, 7]);
    expect(desc.slice(-2)).toEqual([1, 7]);
  });

  it("knob names like __proto__, constructor, knob: are columns and sort", () => {
    const state = withKnobs(JSON.parse('{"1": {"__proto__": 2, "constructor": "b", "knob:": 1}, "2": {"__proto__": 1, "constructor": "a", "knob:": 2}}'));
    expect(knobColumns(state)).toEqual(["__proto__", "constructor", "knob:"]);
    const runs = [...state.runs.values()];
    expect(sortRuns(runs, { column: knobSort("__proto__"), descending: false }, null)).toEqual([2, 1]);
    expect(sortRuns(runs, { column: knobSort("constructor"), descending: false }, null)).toEqual([2, 1]);
    expect(sortRuns(runs, { column: knobSort("knob:"), descending: false }, null)).toEqual([1, 2]);
  });
});

describe("knob labels for names that are Object.prototype members", () => {
  it("readableKnob('constructor') is the name, not Object's source text", () => {
    expect(readableKnob("constructor")).toBe("constructor");
    expect(readableKnob("model.toString")).toBe("toString");
    expect(typeof readableKnob("__proto__")).toBe("string");
  });
});

describe("a clone edit of a knob named __proto__", () => {
  it("knobChanges reports the edit as an own change", () => {
    const original = JSON.parse('{"__proto__": 1, "lr": 1}') as Record<string, unknown>;
    const edited = Object.create(null) as Record<string, string>;
    edited["__proto__"] = "5";
    edited["lr"] = "1";
    const { changes } = knobChanges(original, edited);
    expect(Object.keys(changes)).toEqual(["__proto__"]);
  });
});
