// The worker column and the lost-worker notice, on the recorded Ray log the Python reducer is
// tested with (tests/fixtures/events/ray_workers.jsonl: runs 1-3 on workers w0, w1; w1 killed
// while training run 1's chunk 2) and on a log of the in-kernel engine.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createState, ingest, type PanelState, type WireEvent } from "../src/state";
import {
  dismissKey, hasWorkers, loadDismissed, noticeId, saveDismissed, shownNotices, workerCell, workerLostNotice,
  workerLostNotices, type NoticeStore,
} from "../src/workers";

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "tests", "fixtures", "events");

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

describe("Ray workers in the panel", () => {
  const log = readLog("ray_workers");
  const lostAt = log.find((e) => e.type === "worker_lost")!.seq;

  it("shows the worker column only for an experiment on workers", () => {
    expect(hasWorkers(folded(readLog("sft_basic")))).toBe(false);
    expect(hasWorkers(folded(log))).toBe(true);
    // from the `workers` event on, before any chunk came back
    const firstWorkers = log.find((e) => e.type === "workers")!.seq;
    expect(hasWorkers(folded(log.filter((e) => e.seq < firstWorkers)))).toBe(false);
    expect(hasWorkers(folded(log.filter((e) => e.seq <= firstWorkers)))).toBe(true);
  });

  it("names the worker of each run's last chunk", () => {
    const before = folded(log.filter((e) => e.seq < lostAt));
    const run2 = before.runs.get(2)!;
    expect(workerCell(before, run2)).toEqual({
      text: "w1", title: "last chunk trained on worker w1 (w1:cpu, node 192.0.2.2)",
    });
    const after = folded(log);
    for (const id of [1, 2, 3]) expect(workerCell(after, after.runs.get(id)!).text).toBe("w0");
    const fresh = folded(log.filter((e) => e.type !== "chunk_done"));
    expect(workerCell(fresh, fresh.runs.get(1)!)).toEqual({ text: "–", title: "no chunk trained yet" });
  });

  it("says which runs continue when a worker is lost", () => {
    expect(workerLostNotices(folded(log.filter((e) => e.seq < lostAt)))).toEqual([]);
    const [notice] = workerLostNotices(folded(log));
    expect(notice.text).toBe(
      "worker w1 lost (node 192.0.2.2): runs 1, 2 continue from their last checkpoints on the other workers; "
      + "run 1's chunk 2 (epoch 1) is trained again",
    );
    expect(notice.title).toContain("ray.kill");
  });

  it("says the runs stopped when no worker is left", () => {
    expect(workerLostNotice({
      worker: "w0", node: null, reason: "boom", runs: [3], chunk_lost: { run_id: 3, epoch: 0, chunk: 0 },
      workers_left: 0, time: 1, until: null,
    })).toBe("worker w0 lost: no worker left: run 3 stopped at its last checkpoint; resume it to start new workers");
    expect(workerLostNotice({ worker: "w1", node: "n", reason: null, runs: [4], chunk_lost: null, workers_left: 2, time: null, until: null }))
      .toBe("worker w1 lost (node n): run 4 continues from its last checkpoint on the other workers");
    expect(workerLostNotice({ worker: "w2", node: "n", reason: null, runs: [], chunk_lost: null, workers_left: 1, time: null, until: null }))
      .toBe("worker w2 lost (node n)");
  });
});

describe("dismissing a lost-worker notice", () => {
  const log = readLog("ray_workers");

  function mapStore(): NoticeStore & { data: Map<string, string> } {
    const data = new Map<string, string>();
    return { data, getItem: (k) => data.get(k) ?? null, setItem: (k, v) => void data.set(k, v) };
  }

  it("hides that notice only, and the state keeps the loss", () => {
    const state = folded(log);
    const [loss] = state.lostWorkers;
    const id = noticeId(loss, 0);
    expect(id).toBe(`w1@${loss.time}`);
    expect(shownNotices(state, new Set()).map((n) => n.id)).toEqual([id]);
    expect(shownNotices(state, new Set([id]))).toEqual([]);
    expect(shownNotices(state, new Set(["w1@0"])).map((n) => n.id)).toEqual([id]);
    expect(state.lostWorkers).toHaveLength(1);
  });

  it("is remembered per experiment", () => {
    const store = mapStore();
    const a = dismissKey("/x/exp_a", "exp_a");
    const b = dismissKey("/x/exp_b", "exp_b");
    expect(a).not.toBe(b);
    expect(dismissKey(null, "exp_a")).toBe("rapidfire-panel-dismissed:exp_a");
    expect(dismissKey(null, null)).toBeNull();
    saveDismissed(a, new Set(["w1@5"]), store);
    expect([...loadDismissed(a, store)]).toEqual(["w1@5"]);
    expect([...loadDismissed(b, store)]).toEqual([]);
    // no key, nothing stored
    saveDismissed(null, new Set(["w9@1"]), store);
    expect(store.data.size).toBe(1);
  });

  it("reads anything malformed in the store as nothing dismissed", () => {
    const store = mapStore();
    for (const raw of ["{", "{\"a\": 1}", "[1, null, \"w1@2\"]"]) {
      store.data.set("k", raw);
      expect([...loadDismissed("k", store)]).toEqual(raw.includes("w1@2") ? ["w1@2"] : []);
    }
    const broken: NoticeStore = {
      getItem: () => {
        throw new Error("denied");
      },
      setItem: () => {
        throw new Error("denied");
      },
    };
    // a store that throws: the in-page memory still remembers
    saveDismissed("rapidfire-panel-dismissed:mem", new Set(["w0@1"]), broken);
    expect([...loadDismissed("rapidfire-panel-dismissed:mem", broken)]).toEqual(["w0@1"]);
  });
});
