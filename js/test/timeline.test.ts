// The chunk timeline's layout on the recorded logs Python's reducer is tested with
// (tests/fixtures/events/*.jsonl): lanes per Ray worker or per device, one block per chunk_done,
// the lost worker and its chunk in flight, the time scale and the coalescing of thin blocks.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createState, ingest, type PanelState, type WireEvent } from "../src/state";
import { workerCell } from "../src/workers";
import {
  axisTicks, breakHover, foldedSummary, geometry, hitTest, laneHover, layoutRects, MAX_GROUP_PX, MIN_BLOCK_PX, timelineModel,
  timelineSummary, xOf,
} from "../src/timeline";
import { niceTicks } from "../src/ticks";

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "tests", "fixtures", "events");
const NAMES = readdirSync(FIXTURES).filter((f) => f.endsWith(".jsonl")).map((f) => f.slice(0, -".jsonl".length)).sort();

function readLog(name: string): WireEvent[] {
  return readFileSync(join(FIXTURES, `${name}.jsonl`), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line.replace(/(?<=[:[,]\s*)-?(NaN|Infinity)(?=\s*[,}\]])/g, "null")));
}

function folded(events: WireEvent[]): PanelState {
  const state = createState();
  ingest(state, events);
  return state;
}

const chunkDone = (log: WireEvent[]) => log.filter((e) => e.type === "chunk_done");

describe("chunk timeline on the recorded Ray log", () => {
  const log = readLog("ray_workers");
  const loss = log.find((e) => e.type === "worker_lost")!;
  const done = chunkDone(log);
  const origin = Math.min(...done.map((e) => e.start as number));

  it("has one lane per worker and one block per chunk_done, from its start to its end", () => {
    const model = timelineModel(folded(log));
    expect(model.byWorker).toBe(true);
    expect(model.origin).toBe(origin);
    expect(model.lanes.map((l) => l.key)).toEqual(["w0", "w1"]);
    expect(model.lanes[0].title).toBe("worker w0 (w0:cpu, node 192.0.2.2)");
    const trained = model.blocks.filter((b) => !b.lost);
    // the engine logs moved=true on a run's first chunk too; that one started there (not a move)
    const seen = new Set<unknown>();
    const moved = done.map((e) => {
      const first = !seen.has(e.run_id);
      seen.add(e.run_id);
      return e.moved === true && !first;
    });
    expect(trained.map((b) => [model.lanes[b.lane].key, b.run, b.epoch, b.chunk, b.moved])).toEqual(
      done.map((e, i) => [e.worker, e.run_id, e.epoch, e.chunk, moved[i]]));
    expect(moved.filter(Boolean)).toHaveLength(3); // run 3 w1->w0, run 1 after the loss, run 2 w1->w0
    trained.forEach((b, i) => {
      expect(b.t0).toBeCloseTo((done[i].start as number) - origin, 9);
      expect(b.t1).toBeCloseTo((done[i].end as number) - origin, 9);
      expect(b.title).toContain(`run ${done[i].run_id} · epoch 1 · chunk ${(done[i].chunk as number) + 1}/3`);
      expect(b.title).toContain(`worker ${done[i].worker}`);
      expect(b.title.includes("moved") || b.title.includes("trained again here")).toBe(moved[i]);
      expect(b.title).toContain("Ray round trip beyond the chunk");
    });
    // where a moved run came from: its previous chunk's worker (run 1's chunk 2 was lost on w1)
    const title = (run: number, chunk: number) => trained.find((b) => b.run === run && b.chunk === chunk)!.title;
    expect(title(2, 0)).toContain("started here");
    expect(title(2, 0)).not.toContain("moved");
    expect(title(3, 1)).toContain("moved here from w1");
    expect(title(1, 1)).toContain("trained again here after w1 was lost (from its checkpoint)");
    expect(title(2, 1)).not.toMatch(/moved|started here/);
    expect(model.span).toBeCloseTo(Math.max(...done.map((e) => e.end as number), loss.time as number) - origin, 9);
  });

  it("marks the lost worker's lane from the loss on, and the chunk it lost", () => {
    const model = timelineModel(folded(log));
    const at = (loss.time as number) - origin;
    const [w0, w1] = model.lanes;
    expect(w0.lost).toEqual([]);
    expect(w1.lost).toEqual([{ from: at, to: null, at, reason: loss.reason }]);
    const lost = model.blocks.filter((b) => b.lost);
    expect(lost).toHaveLength(1);
    const [b] = lost;
    const c = loss.chunk_lost as { run_id: number; epoch: number; chunk: number };
    expect([model.lanes[b.lane].key, b.run, b.epoch, b.chunk]).toEqual(["w1", c.run_id, c.epoch, c.chunk]);
    // it started after w1's last logged chunk and after run 1's own previous chunk
    const bound = Math.max(...done.filter((e) => (e.end as number) <= (loss.time as number)
      && (e.worker === "w1" || e.run_id === c.run_id)).map((e) => e.end as number)) - origin;
    expect(b.t0).toBeCloseTo(bound, 9);
    expect(b.t1).toBeCloseTo(at, 9);
    expect(b.t0).toBeLessThan(b.t1);
    expect(b.title).toContain("lost with worker w1");
    expect(b.title).toContain("trained again on another worker");
    expect(timelineSummary(model)).toMatch(/^chunk timeline: 9 chunks on 2 workers \(1 lost\) · \d/);
    expect(foldedSummary(folded(log))).toBe("chunk timeline: 9 chunks on 2 workers (1 lost)");
  });

  it("shows no loss before the worker_lost event", () => {
    const model = timelineModel(folded(log.filter((e) => e.seq < loss.seq)));
    expect(model.lanes.map((l) => [l.key, l.lost.length])).toEqual([["w0", 0], ["w1", 0]]);
    expect(model.blocks.some((b) => b.lost)).toBe(false);
    // the workers event alone: both lanes, no blocks, no time yet
    const early = timelineModel(folded(log.filter((e) => e.seq <= log.find((x) => x.type === "workers")!.seq)));
    expect(early.lanes.map((l) => l.key)).toEqual(["w0", "w1"]);
    expect(early.origin).toBeNull();
    expect(timelineSummary(early)).toBe("chunk timeline (after the first chunk)");
  });

  it("ends a lost span where a later session's workers event lists that name again", () => {
    // the same log resumed: a second session's pool lists w0, w1 again, and its w1 trains
    const last = log[log.length - 1].seq;
    const workers = log.find((e) => e.type === "workers")!;
    const listed = { ...workers, seq: last + 1, time: (log[log.length - 1].time as number) + 50 };
    const later = done.filter((e) => e.worker === "w1").map((e, i) => ({
      ...e, seq: last + 2 + i, start: (e.start as number) + 60, end: (e.end as number) + 60, time: (e.time as number) + 60,
    }));
    const model = timelineModel(folded([...log, listed, ...later]));
    const [span] = model.lanes[1].lost;
    expect(span.to).toBeCloseTo((listed.time as number) - origin, 9);
    expect(timelineSummary(model)).not.toContain("lost");
    // only the listing ends it: chunks of w1 alone (no workers event) leave it lost
    const unlisted = timelineModel(folded([...log, ...later.map((e) => ({ ...e, seq: e.seq - 1 }))]));
    expect(unlisted.lanes[1].lost[0].to).toBeNull();
  });
});

describe("chunk timeline of the in-kernel engine", () => {
  it("has one lane for the device and no worker wording", () => {
    const log = readLog("sft_basic");
    const model = timelineModel(folded(log));
    expect(model.byWorker).toBe(false);
    expect(model.lanes.map((l) => [l.key, l.title])).toEqual([["cpu", "device cpu"]]);
    expect(model.blocks).toHaveLength(chunkDone(log).length);
    for (const b of model.blocks) {
      expect(b.title).not.toMatch(/worker|moved/);
      expect(b.title).toContain("on cpu");
    }
    expect(timelineSummary(model)).toMatch(/^chunk timeline: 4 chunks on cpu · /);
    expect(foldedSummary(folded(log))).toBe("chunk timeline: 4 chunks");
  });

  it.each(NAMES)("%s: a block per chunk_done, in order, on the time axis from the first chunk", (name) => {
    const log = readLog(name);
    const done = chunkDone(log);
    const model = timelineModel(folded(log));
    const trained = model.blocks.filter((b) => !b.lost);
    expect(trained.map((b) => [b.run, b.epoch, b.chunk])).toEqual(done.map((e) => [e.run_id, e.epoch, e.chunk]));
    expect(Math.min(...trained.map((b) => b.t0))).toBe(0);
    for (const b of model.blocks) expect(b.t1).toBeGreaterThanOrEqual(b.t0);
    const lanes = new Set(done.map((e) => (typeof e.worker === "string" ? e.worker : e.device)));
    for (const l of lanes) expect(model.lanes.map((x) => x.key)).toContain(l);
    if (name !== "ray_workers") expect(model.byWorker).toBe(false);
  });
});

describe("timeline pixels", () => {
  const state = folded(readLog("ray_workers"));
  const model = timelineModel(state);

  it("draws each chunk of the Ray log as its own rectangle at panel width", () => {
    const g = geometry(model, 1000);
    const rects = layoutRects(model, g);
    expect(rects).toHaveLength(model.blocks.length);
    for (const r of rects) {
      const b = model.blocks[r.blocks[0]];
      expect(r.x).toBeCloseTo(xOf(g, b.t0), 9);
      expect(r.run).toBe(b.run);
      expect(r.lost).toBe(b.lost);
    }
    // the axis starts at the gutter and the last chunk ends inside the canvas
    expect(xOf(g, 0)).toBe(g.gutter);
    expect(xOf(g, model.span)).toBeLessThan(g.width);
    // a point inside a rectangle hits it; the gutter hits nothing
    const r = rects.find((x) => x.w > 10)!;
    const y = g.top + r.lane * g.laneH + g.laneH / 2;
    expect(hitTest(rects, g, r.x + r.w / 2, y)).toBe(r);
    expect(hitTest(rects, g, 5, y)).toBeNull();
    expect(hitTest(rects, g, r.x + r.w / 2, g.top + model.lanes.length * g.laneH + 5)).toBeNull();
  });

  it("names the lane under the label and the lost worker over its hatched part", () => {
    const g = geometry(model, 1000);
    const at = model.lanes[1].lost[0].from;
    const mid = (lane: number) => g.top + lane * g.laneH + g.laneH / 2;
    expect(laneHover(model, g, 10, mid(0))).toBe("worker w0 (w0:cpu, node 192.0.2.2)");
    const lost = `worker w1 lost at ${at.toFixed(2)} s: The actor is dead because it was killed by \`ray.kill\`.`;
    expect(laneHover(model, g, 10, mid(1))).toBe(`worker w1 (w1:cpu, node 192.0.2.2); ${lost}`);
    expect(laneHover(model, g, xOf(g, at) + 20, mid(1))).toBe(lost);
    expect(laneHover(model, g, xOf(g, at) - 20, mid(1))).toBeNull();
    expect(laneHover(model, g, xOf(g, at) + 20, mid(0))).toBeNull();
    expect(laneHover(model, g, 10, mid(2))).toBeNull();
  });

  it("merges thin chunks, covering every chunk once and keeping the lost one apart", () => {
    const g = geometry(model, 110); // 38 px for 1.8 s: most chunks are under MIN_BLOCK_PX
    const rects = layoutRects(model, g);
    expect(rects.length).toBeLessThan(model.blocks.length);
    const covered = rects.flatMap((r) => r.blocks).sort((a, b) => a - b);
    expect(covered).toEqual(model.blocks.map((_, i) => i));
    for (const r of rects) {
      if (r.blocks.length > 1) {
        expect(r.w).toBeLessThanOrEqual(MAX_GROUP_PX + 1e-9);
        expect(r.lost).toBe(false);
        expect(r.title).toMatch(/^\d+ short chunks/);
        for (const i of r.blocks) expect(model.blocks[i].lane).toBe(r.lane);
      }
    }
    const lost = rects.filter((r) => r.lost);
    expect(lost).toHaveLength(1);
    expect(lost[0].blocks).toHaveLength(1);
    expect(lost[0].w).toBeGreaterThanOrEqual(MIN_BLOCK_PX);
  });

  it("stays bounded with 48 runs and hundreds of chunks", () => {
    // the recorded kernel-engine chunks, replayed as 48 runs x 12 chunks one after the other
    const base = chunkDone(readLog("sft_basic"))[0];
    const events: WireEvent[] = [];
    let seq = 1;
    let t = 1000;
    for (let c = 0; c < 12; c++) {
      for (let run = 1; run <= 48; run++) {
        const d = 0.2 + (run % 5) * 0.1;
        events.push({ ...base, seq: seq++, run_id: run, epoch: 0, chunk: c, start: t, end: t + d, time: t + d });
        t += d + 0.01;
      }
    }
    const big = timelineModel(folded(events));
    expect(big.blocks).toHaveLength(576);
    expect(big.lanes).toHaveLength(1);
    const g = geometry(big, 900);
    const rects = layoutRects(big, g);
    expect(rects.length).toBeLessThanOrEqual((g.width - g.gutter) / 1.5);
    expect(rects.flatMap((r) => r.blocks)).toHaveLength(576);
    const wide = layoutRects(big, geometry(big, 6000));
    expect(wide).toHaveLength(576);
  });

  // 300,000 rows: seconds on a loaded 2-core machine, so a generous limit (a speed goal lives in
  // `rapidfire bench`, not here).
  it("lays out more chunks than a function call takes arguments", { timeout: 60_000 }, () => {
    const s = folded(readLog("sft_basic"));
    const row = s.timeline[0];
    s.timeline = Array.from({ length: 300_000 }, (_, i) => ({ ...row, start: 5000 - i * 0.01, end: 5000 - i * 0.01 + 0.005 }));
    const huge = timelineModel(s);
    expect(huge.origin).toBeCloseTo(5000 - 299_999 * 0.01, 6);
    const rects = layoutRects(huge, geometry(huge, 1000));
    expect(rects.length).toBeLessThan(1000);
  });

  it("picks round ticks", () => {
    // The curve charts' ticks (one implementation for both views), from zero over a span.
    expect(niceTicks(0, 1.8, 4).ticks).toEqual([0, 0.5, 1, 1.5]);
    expect(niceTicks(0, 10.6, 5).ticks).toEqual([0, 5, 10]);
    expect(niceTicks(0, 100, 10).ticks).toEqual([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
    expect(niceTicks(0, 0, 5).ticks).toEqual([0]);
    const g = geometry(model, 800);
    for (const t of axisTicks(model, g)) expect(t.label).toMatch(/^\d+(\.\d+)? (s|min|h)$/);
  });

  it("gives many lanes thinner rows instead of a tall canvas", () => {
    expect(geometry(model, 800).laneH).toBe(20);
    const many = { ...model, lanes: Array.from({ length: 32 }, (_, i) => ({ key: `w${i}`, label: `w${i}`, title: "", lost: [] })) };
    expect(geometry(many, 800).laneH).toBe(10);
  });
});

// ---------------------------------------------------------------------------------------------
// Resumed, damaged and multi-node versions of the recorded Ray log (a review's findings, session 5).

const LOG: WireEvent[] = readLog("ray_workers");

const copyLog = (): WireEvent[] => JSON.parse(JSON.stringify(LOG));

/** Folds events after renumbering their seqs 1..n (the reducer applies them in seq order). */
function foldRenumbered(events: WireEvent[]): PanelState {
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

describe("a resumed experiment reuses worker names", () => {
  it("a worker listed again by a later session is not 'lost' in the folded summary or the worker cell", () => {
    const state = foldRenumbered(resumedLog());
    const model = timelineModel(state);
    // the open timeline already knows the new w1 trains (its lost span ended) ...
    expect(timelineSummary(model)).not.toContain("lost");
    // ... but the folded summary and the run table's worker cell still call it lost
    expect(foldedSummary(state)).not.toContain("lost");
    expect(workerCell(state, state.runs.get(3)!).title).not.toContain("since lost");
  });
});

describe("chunk times on the worker's clock, the loss on the controller's", () => {
  it("a worker node whose clock runs 2 s ahead still shows as lost, with no 'later session'", () => {
    const log = copyLog();
    for (const e of log) {
      if (e.type === "chunk_done" && e.worker === "w1") {
        e.start = (e.start as number) + 2;
        e.end = (e.end as number) + 2;
      }
    }
    const model = timelineModel(foldRenumbered(log));
    const w1 = model.lanes.find((l) => l.key === "w1")!;
    expect(w1.lost).toHaveLength(1);
    expect(w1.lost[0].to).toBeNull(); // no later session exists in this log
    expect(timelineSummary(model)).toContain("(1 lost)");
    const g = geometry(model, 1000);
    const hover = laneHover(model, g, 10, g.top + model.lanes.indexOf(w1) * g.laneH + g.laneH / 2) ?? "";
    expect(hover).not.toContain("later session");
  });
});

describe("damaged or unusual Ray logs", () => {
  it("a worker lost in its constructor, before the first chunk, is not lost at a negative time ", () => {
    const log = copyLog();
    const at = log.findIndex((e) => e.type === "workers");
    log.splice(at, 0, {
      seq: 0, type: "worker_lost", time: (log[at].time as number) - 1, worker: "w2", node: null,
      reason: "TimeoutError: worker w2 was not placed on the Ray cluster within 300 s", runs: [], chunk_lost: null,
      workers_left: 2,
    });
    const model = timelineModel(foldRenumbered(log));
    const w2 = model.lanes.find((l) => l.key === "w2")!;
    expect(w2.lost[0].from).toBeGreaterThanOrEqual(0);
    const g = geometry(model, 1000);
    const hover = laneHover(model, g, 10, g.top + model.lanes.indexOf(w2) * g.laneH + g.laneH / 2) ?? "";
    expect(hover).not.toMatch(/lost at -/);
  });

  it("the folded and the open summary count the same chunks when some chunk_done lack start/end ", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "chunk_done" && e.run_id === 3) { delete e.start; delete e.end; }
    const state = foldRenumbered(log);
    const count = (s: string) => Number(/(\d+) chunks?/.exec(s)?.[1]);
    expect(count(foldedSummary(state))).toBe(count(timelineSummary(timelineModel(state))));
  });

  it("the folded and the open summary agree a worker was lost when its worker_lost has no time ", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "worker_lost") delete e.time;
    const state = foldRenumbered(log);
    expect(foldedSummary(state)).toContain("(1 lost)");
    expect(timelineSummary(timelineModel(state))).toContain("(1 lost)");
  });

  it("a blank Ray reason does not leave a dangling colon in the lost lane's hover ", () => {
    const log = copyLog();
    for (const e of log) if (e.type === "worker_lost") e.reason = "\n  \n";
    const model = timelineModel(foldRenumbered(log));
    const g = geometry(model, 1000);
    const w1 = model.lanes.findIndex((l) => l.key === "w1");
    const hover = laneHover(model, g, xOf(g, model.lanes[w1].lost[0].from) + 30, g.top + w1 * g.laneH + g.laneH / 2);
    expect(hover).not.toMatch(/:\s*$/);
  });
});

describe("hover wording", () => {
  it("a run's very first chunk is not called a move", () => {
    const model = timelineModel(foldRenumbered(copyLog()));
    const first = new Map<number, string>();
    for (const b of model.blocks) if (!b.lost && !first.has(b.run)) first.set(b.run, b.title);
    for (const title of first.values()) expect(title).not.toContain("moved");
  });
});

describe("a resumed experiment's time axis", () => {
  it("resumed a day later, each session's chunks are still drawn one rectangle each at 1200 px", () => {
    const day = 86400;
    const later = copyLog().map((e) => ({
      ...e, time: (e.time as number) + day,
      ...(e.type === "chunk_done" ? { start: (e.start as number) + day, end: (e.end as number) + day } : {}),
    }));
    const model = timelineModel(foldRenumbered([...copyLog(), ...later]));
    const rects = layoutRects(model, geometry(model, 1200));
    // one session alone: 10 rectangles, one per block; two sessions a day apart: 6 slivers of 1-3 px
    expect(rects.filter((r) => r.blocks.length > 1)).toEqual([]);
    // the day between the sessions is one break, said in the summary, the hover and the ticks
    expect(model.breaks).toHaveLength(1);
    expect(model.breaks[0].skipped).toBeGreaterThan(day - 60);
    expect(timelineSummary(model)).toMatch(/busy \(2\d\.\d h idle not drawn\)/);
    const g = geometry(model, 1200);
    expect(breakHover(model, g, xOf(g, model.breaks[0].at + model.breaks[0].shown / 2))).toMatch(/^no chunk for 2\d\.\d h/);
    const ticks = axisTicks(model, g);
    const seconds = ticks.map((t) => Number.parseFloat(t.label));
    expect(seconds.some((v) => v > day)).toBe(true); // the second session's ticks read its real time
    for (const t of ticks) expect(t.t).toBeGreaterThanOrEqual(0);
    // no break within one session: the ticks are the round seconds from the first chunk
    const one = timelineModel(foldRenumbered(copyLog()));
    expect(one.breaks).toEqual([]);
    expect(axisTicks(one, geometry(one, 1200)).map((t) => t.label).slice(0, 3)).toEqual(["0 s", "0.2 s", "0.4 s"]);
  });
});
