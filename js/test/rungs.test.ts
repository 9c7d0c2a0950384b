// Pruning rungs on the eval chart: where each pruned run was cut, with the pruner's reason.
import { describe, expect, it } from "vitest";
import { createState, ingest, type WireEvent } from "../src/state";
import { runColor } from "../src/palette";
import { statusBadge } from "../src/table";
import { pruneRungs } from "../src/chartplan";

function log(): WireEvent[] {
  const raw: Record<string, unknown>[] = [];
  for (const id of [1, 2, 3]) {
    raw.push({ type: "run_created", run_id: id, trainer_type: "SFT", knobs: {}, parent_run_id: null, warm_start: false,
      total_steps: 8, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 0 });
    raw.push({ type: "run_status", run_id: id, status: "running", reason: null });
    raw.push({ type: "metric", run_id: id, split: "train", step: 2, samples_seen: 16, metrics: { loss: 3 } });
    raw.push({ type: "metric", run_id: id, split: "eval", step: 2, samples_seen: 16, metrics: { eval_loss: 2 + id } });
  }
  raw.push({ type: "metric", run_id: 1, split: "eval", step: 4, samples_seen: 32, metrics: { eval_loss: 2.5 } });
  raw.push({ type: "metric", run_id: 3, split: "eval", step: 4, samples_seen: 32, metrics: { eval_loss: 4.5 } });
  // Run 3's last point is not finite: its rung is the last point the chart can draw.
  raw.push({ type: "metric", run_id: 3, split: "eval", step: 6, samples_seen: 48, metrics: { eval_loss: "NaN" } });
  raw.push({ type: "run_status", run_id: 2, status: "stopped", reason: "stopped by user" });
  raw.push({ type: "run_status", run_id: 3, status: "stopped", reason: "pruned at chunk 2 (rank 3 of 3)", pruned: true });
  raw.push({ type: "run_status", run_id: 1, status: "stopped", reason: "pruned at chunk 4 (rank 2 of 3)", pruned: true });
  return raw.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent);
}

describe("pruneRungs", () => {
  it("marks each pruned run's last eval point with its reason; not a user stop, not a train chart", () => {
    const state = createState();
    ingest(state, log());
    expect(pruneRungs(state, "eval", "eval_loss")).toEqual([
      { runId: 1, x: 32, y: 2.5, color: runColor(1), text: "run 1: pruned at chunk 4 (rank 2 of 3)" },
      { runId: 3, x: 32, y: 4.5, color: runColor(3), text: "run 3: pruned at chunk 2 (rank 3 of 3)" },
    ]);
    expect(pruneRungs(state, "train", "loss")).toEqual([]);
    expect(pruneRungs(state, "eval", "eval_accuracy")).toEqual([]);
    expect(pruneRungs(state, "eval", null)).toEqual([]);
  });

  it("a resumed run loses its rung; the table badge keeps the full reason on hover", () => {
    const state = createState();
    ingest(state, log());
    const badge = statusBadge(state.runs.get(1)!, state);
    expect(badge.text).toBe("pruned");
    expect(badge.title).toBe("pruned at chunk 4 (rank 2 of 3)");
    ingest(state, [{ seq: log().length + 1, type: "run_status", run_id: 1, status: "running", reason: null } as WireEvent]);
    expect(pruneRungs(state, "eval", "eval_loss").map((r) => r.runId)).toEqual([3]);
  });
});
