// Suggest mode: the pruner's marks arrive as events; the user's answers (logged ops) clear them.
import { describe, expect, it } from "vitest";
import { createState, ingest, type WireEvent } from "../src/state";
import { suggestedRuns, suggestionOpen } from "../src/suggest";

function seq(raw: Record<string, unknown>[], from = 1): WireEvent[] {
  return raw.map((e, i) => ({ ...e, seq: from + i }) as WireEvent);
}

function created(): Record<string, unknown>[] {
  const raw: Record<string, unknown>[] = [];
  for (const id of [1, 2, 3, 4]) {
    raw.push({ type: "run_created", run_id: id, trainer_type: "SFT", knobs: {}, parent_run_id: null, warm_start: false,
      total_steps: 8, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 0 });
    raw.push({ type: "run_status", run_id: id, status: "pending", reason: null });
  }
  return raw;
}

const mark = (id: number, rank: number) => ({
  type: "pruning_suggested", run_id: id, rung: 1, rank, of: 4, reason: `pruned at chunk 1 (rank ${rank} of 4)`,
});
const answer = (op: string, id: number, accepted = true) => ({
  type: "op", op, run_id: id, accepted, reason: accepted ? null : `run ${id} is completed`, new_run_id: null,
});

describe("pruning suggestions", () => {
  it("a mark opens a question on its run; confirm, ignore and a refused confirm each close it", () => {
    const state = createState();
    ingest(state, seq(created()));
    const r = ingest(state, seq([mark(3, 3), mark(4, 4), mark(2, 2)], 9));
    expect([...r.changedRuns].sort()).toEqual([2, 3, 4]);
    expect(state.runs.get(3)!.suggestion).toBe("pruned at chunk 1 (rank 3 of 4)");
    expect(suggestedRuns(state)).toEqual([2, 3, 4]);
    ingest(state, seq([answer("confirm_suggestion", 3), answer("ignore_suggestion", 4),
      answer("confirm_suggestion", 2, false)], 12));
    expect(suggestedRuns(state)).toEqual([]);
    expect(state.runs.get(4)!.suggestion).toBeNull();
    // other ops leave an open question alone
    ingest(state, seq([mark(1, 3), answer("stop", 2)], 15));
    expect(suggestedRuns(state)).toEqual([1]);
  });

  it("is asked only while the run can still be stopped; a mark for an unknown run invents no row", () => {
    const state = createState();
    ingest(state, seq([...created(), mark(1, 3), mark(9, 4)]));
    expect(state.runs.has(9)).toBe(false);
    const run = state.runs.get(1)!;
    expect(suggestionOpen(run)).toBe(true);
    ingest(state, seq([{ type: "run_status", run_id: 1, status: "completed", reason: null }], 11));
    expect(run.suggestion).not.toBeNull();
    expect(suggestionOpen(run)).toBe(false);
    expect(suggestedRuns(state)).toEqual([]);
  });

  it("a view that replays the whole log (a restart, a late render) sees the same open questions", () => {
    const log = seq([...created(), mark(2, 3), mark(3, 4), answer("ignore_suggestion", 2)]);
    const live = createState();
    for (const ev of log) ingest(live, [ev]);
    const late = createState();
    ingest(late, [...log].reverse());    // out of order: buffered until the gap fills
    expect(suggestedRuns(late)).toEqual(suggestedRuns(live));
    expect(suggestedRuns(late)).toEqual([3]);
  });
});
