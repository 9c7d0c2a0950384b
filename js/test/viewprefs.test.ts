// The view's set-up (filters, sort, group, metrics) remembered per experiment across re-renders;
// eval markers thinned at scale.
import { describe, expect, it } from "vitest";
import { defaultPrefs, loadPrefs, parsePrefs, prefsKey, savePrefs, type PrefStore } from "../src/viewprefs";
import { EVAL_MARKER_RUNS, evalMarkers, timeSplitInterval } from "../src/scale";

function mapStore(): PrefStore & { map: Map<string, string> } {
  const map = new Map<string, string>();
  return { map, getItem: (k) => map.get(k) ?? null, setItem: (k, v) => void map.set(k, v) };
}

describe("view prefs", () => {
  it("round-trip per experiment: another experiment keeps its own", () => {
    const store = mapStore();
    const a = prefsKey("/x/exp-a", "exp-a");
    const b = prefsKey("/x/exp-b", "exp-b");
    const prefs = { ...defaultPrefs(), hide: { stopped: true, pruned: false, deleted: true },
      sort: { column: "eval" as const, descending: true }, groupOpen: true,
      metrics: { train: "grad_norm", eval: "eval_accuracy" } };
    savePrefs(a, prefs, store);
    expect(loadPrefs(a, store)).toEqual(prefs);
    expect(loadPrefs(b, store)).toBeNull();
    expect(loadPrefs(null, store)).toBeNull();
    expect(prefsKey(null, "only-name")).toBe(prefsKey("only-name", null));
    expect(prefsKey(null, null)).toBeNull();
  });

  it("falls back to page memory when storage throws (sandboxed iframes)", () => {
    const broken: PrefStore = {
      getItem: () => { throw new Error("denied"); },
      setItem: () => { throw new Error("denied"); },
    };
    const key = prefsKey("/x/sandboxed", null);
    const prefs = { ...defaultPrefs(), groupOpen: true };
    savePrefs(key, prefs, broken);
    expect(loadPrefs(key, broken)).toEqual(prefs);
    expect(loadPrefs(key, null)).toEqual(prefs);
  });

  it("checks what it reads field by field", () => {
    expect(parsePrefs("not json")).toBeNull();
    expect(parsePrefs("[1,2]")).toBeNull();
    expect(parsePrefs(null)).toBeNull();
    const p = parsePrefs(JSON.stringify({
      hide: { stopped: "yes", pruned: true }, sort: { column: "__proto__", descending: true },
      groupOpen: 1, metrics: { train: 5, eval: "eval_loss" },
    }))!;
    expect(p.hide).toEqual({ stopped: false, pruned: true, deleted: false });
    expect(p.sort).toEqual({ column: "auto", descending: false });
    expect(p.groupOpen).toBe(false);
    expect(p.metrics).toEqual({ train: null, eval: "eval_loss" });
  });
});

describe("a remembered knob sort", () => {
  it("is kept when it names a knob, and dropped for a bare prefix", () => {
    const ok = parsePrefs(JSON.stringify({ sort: { column: "knob:training_args.learning_rate", descending: true } }))!;
    expect(ok.sort).toEqual({ column: "knob:training_args.learning_rate", descending: true });
    const bare = parsePrefs(JSON.stringify({ sort: { column: "knob:", descending: true } }))!;
    expect(bare.sort).toEqual({ column: "auto", descending: false });
  });
});

describe("eval markers at scale", () => {
  it("train curves never have markers; eval curves only while few runs are shown or when focused", () => {
    expect(evalMarkers("train", 1, true)).toBe("lines");
    expect(evalMarkers("eval", 4, false)).toBe("lines+markers");
    expect(evalMarkers("eval", EVAL_MARKER_RUNS, false)).toBe("lines+markers");
    expect(evalMarkers("eval", 48, false)).toBe("lines");
    expect(evalMarkers("eval", 48, true)).toBe("lines+markers");
  });
});

describe("time split redraws", () => {
  it("come at most every 2 s for a few runs, less often as bars are added, at least every 12 s", () => {
    expect(timeSplitInterval(1)).toBe(2000);
    expect(timeSplitInterval(8)).toBe(2000);
    expect(timeSplitInterval(16)).toBe(4000);
    expect(timeSplitInterval(48)).toBe(12000);
    expect(timeSplitInterval(500)).toBe(12000);
  });
});
