// Review of issue 19's panel parts (session 5, helper T): regressions found by driving the chunk
// timeline and the worker notices with damaged, resumed and multi-node versions of the recorded
// Ray log (tests/fixtures/events/ray_workers.jsonl). Each test fails on h_t e19140b; see
// /work/notes/review_s5_t.md for the finding it belongs to (F-numbers below).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createState, ingest, type PanelState, type WireEvent } from "../src/state";
import { foldedSummary, geometry, laneHover, layoutRects, timelineModel, timelineSummary, xOf } from "../src/timeline";
import { workerCell } from "../src/workers";

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "tests", "fixtures", "events");
const LOG: WireEvent[] = readFileSync(join(FIXTURES, "ray_workers.jsonl"), "utf8")
  .split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l));

const copyLog = (): WireEvent[] => JSON.parse(JSON.stringify(LOG));

/** Folds events after renumbering their seqs 1..n (the reducer applies them in seq order). */
function fold(events: WireEvent[]): PanelState {
  const state = createState();
  ingest(state, events.map((e, i) => ({ ...e, seq: i + 1 })));
  return state;
}

/** The log, then a second session (resume=True in a new kernel): a new pool names its workers
 * w0, w1 again, and the new w1 trains run 3 one minute later. */
function resumedLog(): WireEvent[] {
  const log = copyLog();
  const end = log[log.length - 1].time as number;
  const workers = log.find((e) => e.type === "workers")!;
  const chunk = log.filter((e) => e.type === "chunk_done").pop()!;
  return [
    ...log,
    { seq: 0, type: "experiment", time: end + 50, name: "ray_workers", path: "/p", resumed: true },
    { ...workers, time: end + 55 },
    { ...chunk, worker: "w1", device: "w1:cpu", start: end + 56, end: end + 57, time: end + 57 },
  ];
}

describe("review s5_t: resumed experiments reuse worker names (F1)", () => {
  it("a worker listed again by a later session is not 'lost' in the folded summary or the worker cell", () => {
    const state = fold(resumedLog());
    const model = timelineModel(state);
    // the open timeline already knows the new w1 trains (its lost span ended) ...
    expect(timelineSummary(model)).not.toContain("lost");
    // ... but the folded summary and the run table's worker cell still call it lost
    expect(foldedSummary(state)).not.toContain("lost");
    expect(workerCell(state, state.runs.get(3)!).title).not.toContain("since lost");
  });
});

describe("review s5_t: chunk times come from the worker's clock, the loss from the controller's (F2)", () => {
  it("a worker node whose clock runs 2 s ahead still shows as lost, with no 'later session'", () => {
    const log = copyLog();
    for (const e of log) {
      if (e.type === "chunk_done" && e.worker === "w1") {
        e.start = (e.start as number) + 2;
        e.end = (e.end as number) + 2;
      }
    }
    const model = timelineModel(fold(log));
    const w1 = model.lanes.find((l) => l.key === "w1")!;
    expect(w1.lost).toHaveLength(1);
    expect(w1.lost[0].to).toBeNull(); // no later session exists in this log
    expect(timelineSummary(model)).toContain("(1 lost)");
    const g = geometry(model, 1000);
    const hover = laneHover(model, g, 10, g.top + model.lanes.indexOf(w1) * g.laneH + g.laneH / 2) ?? "";
    expect(hover).not.toContain("later session");
  });
});

describe("review s5_t: damaged or unusual logs (F5, F6, F7)", () => {
  it("a worker lost in its constructor, before the first chunk, is not lost at a negative time (F5)", () => {
    const log = copyLog();
    const at = log.findIndex((e) => e.type === "workers");
    log.splice(at, 0, {
      seq: 0, type: "worker_lost", time: (log[at].time as number) - 1, worker: "w2", node: null,
      reason: "TimeoutError: worker w2 was not placed on the Ray cluster within 300 s", runs: [], chunk_lost: null,
      workers_left: 2,
    });
    const model = timelineModel(fold(log));
    const w2 = model.lanes.find((l) => l.key === "w2")!;
    expect(w2.lost[0].from).toBeGreaterThanOrEqual(0);
    const g = geometry(model, 1000);
    const hover = laneHover(model, g, 10, g.top + model.lanes.indexOf(w2) * g.laneH + g.laneH / 2) ?? "";
    expect(hover).not.toMatch(/lost at -/);
  });

  it("the folded and the open summary count the same chunks when some chunk_done lack start/end (F6)", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "chunk_done" && e.run_id === 3) { delete e.start; delete e.end; }
    const state = fold(log);
    const count = (s: string) => Number(/(\d+) chunks?/.exec(s)?.[1]);
    expect(count(foldedSummary(state))).toBe(count(timelineSummary(timelineModel(state))));
  });

  it("the folded and the open summary agree a worker was lost when its worker_lost has no time (F6)", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "worker_lost") delete e.time;
    const state = fold(log);
    expect(foldedSummary(state)).toContain("(1 lost)");
    expect(timelineSummary(timelineModel(state))).toContain("(1 lost)");
  });

  it("a blank Ray reason does not leave a dangling colon in the lost lane's hover (F7)", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "worker_lost") e.reason = "\n  \n";
    const model = timelineModel(fold(log));
    const g = geometry(model, 1000);
    const w1 = model.lanes.findIndex((l) => l.key === "w1");
    const hover = laneHover(model, g, xOf(g, model.lanes[w1].lost[0].from) + 30, g.top + w1 * g.laneH + g.laneH / 2);
    expect(hover).not.toMatch(/:\s*$/);
  });
});

describe("review s5_t: hover wording (F8)", () => {
  it("a run's very first chunk is not called a move", () => {
    const model = timelineModel(fold(copyLog()));
    const first = new Map<number, string>();
    for (const b of model.blocks) if (!b.lost && !first.has(b.run)) first.set(b.run, b.title);
    for (const title of first.values()) expect(title).not.toContain("moved");
  });
});

describe("review s5_t: a resumed experiment's time axis (F13)", () => {
  it("resumed a day later, each session's chunks are still drawn one rectangle each at 1200 px", () => {
    const day = 86400;
    const later = copyLog().map((e) => ({
      ...e, time: (e.time as number) + day,
      ...(e.type === "chunk_done" ? { start: (e.start as number) + day, end: (e.end as number) + day } : {}),
    }));
    const model = timelineModel(fold([...copyLog(), ...later]));
    const rects = layoutRects(model, geometry(model, 1200));
    // one session alone: 10 rectangles, one per block; two sessions a day apart: 6 slivers of 1-3 px
    expect(rects.filter((r) => r.blocks.length > 1)).toEqual([]);
  });
});
