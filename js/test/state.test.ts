// State handling of the panel view: snapshot + deltas, duplicates, gaps, late render, chart plans.
import { describe, expect, it } from "vitest";
import {
  applySnapshot,
  createState,
  ingest,
  noteQueued,
  noteOnDevice,
  MAX_PENDING,
  needsPull,
  noteKnownSeq,
  type WireEvent,
} from "../src/state";
import { runColor } from "../src/palette";
import {
  dataStartText,
  knobCellText,
  progressFraction,
  stepTitle,
  readableKnob,
  progressText,
  shortKnobNames,
} from "../src/format";
import {
  headerCounts,
  headerCountTitle,
  statusBadge,
  knobColumns,
  legalOps,
  sortRuns,
} from "../src/table";
import {
  createChartBook,
  defaultMetric,
  waitingText,
  planChart,
  planIsEmpty,
  timeSplitFigure,
} from "../src/chartplan";
import {
  knobChanges,
  cloneFormKnobs,
  knobNamedIn,
  parseKnobInput,
} from "../src/cloneform";

/** A small but complete experiment log, shaped like rapidfire_nb/engine/events.py's schema. */
function experimentLog(): WireEvent[] {
  const raw: Omit<WireEvent, "seq">[] = [
    { type: "experiment", name: "sft-demo", path: "/tmp/x", resumed: false },
    { type: "run_created", run_id: 1, trainer_type: "SFT", knobs: { "training_args.learning_rate": 1e-3 },
      parent_run_id: null, warm_start: false, total_steps: 8, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 0 },
    { type: "run_created", run_id: 2, trainer_type: "SFT", knobs: { "training_args.learning_rate": 1e-4 },
      parent_run_id: null, warm_start: false, total_steps: 8, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 0 },
    { type: "run_status", run_id: 1, status: "pending", has_error: false, reason: null },
    { type: "run_status", run_id: 2, status: "pending", has_error: false, reason: null },
    { type: "run_status", run_id: 1, status: "running", has_error: false, reason: null },
    { type: "metric", run_id: 1, split: "train", step: 1, samples_seen: 8, epoch: 0, chunk: 0, metrics: { loss: 3.0, learning_rate: 1e-3 } },
    { type: "metric", run_id: 1, split: "train", step: 2, samples_seen: 16, epoch: 0, chunk: 0, metrics: { loss: 2.5, learning_rate: 1e-3 } },
    { type: "metric", run_id: 1, split: "eval", step: 2, samples_seen: 16, epoch: 0, chunk: 0, metrics: { eval_loss: 2.8, eval_runtime: 0.1 } },
    { type: "chunk_done", run_id: 1, epoch: 0, chunk: 0, device: "cpu", start: 0, end: 1, train_s: 0.8, eval_s: 0.1,
      swap_s: 0.05, other_s: 0.05, completed_steps: 2, total_steps: 8, samples_seen: 16, chunks_done: 1 },
    { type: "run_status", run_id: 1, status: "pending", has_error: false, reason: null },
    { type: "run_status", run_id: 2, status: "running", has_error: false, reason: null },
    { type: "metric", run_id: 2, split: "train", step: 1, samples_seen: 8, epoch: 0, chunk: 0, metrics: { loss: 3.1 } },
    { type: "metric", run_id: 2, split: "train", step: 2, samples_seen: 16, epoch: 0, chunk: 0, metrics: { loss: 2.9 } },
    { type: "metric", run_id: 2, split: "eval", step: 2, samples_seen: 16, epoch: 0, chunk: 0, metrics: { eval_loss: 3.0 } },
    { type: "chunk_done", run_id: 2, epoch: 0, chunk: 0, device: "cpu", start: 1, end: 2, train_s: 0.7, eval_s: 0.1,
      swap_s: 0.1, other_s: 0.1, completed_steps: 2, total_steps: 8, samples_seen: 16, chunks_done: 1 },
    { type: "op", op: "stop", run_id: 2, accepted: true, reason: null, new_run_id: null },
    { type: "run_status", run_id: 2, status: "stopped", has_error: false, reason: "stopped by user" },
    { type: "run_created", run_id: 3, trainer_type: "SFT", knobs: { "training_args.learning_rate": 5e-4, "peft_config.r": 16 },
      parent_run_id: 1, warm_start: true, total_steps: 8, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 16 },
    { type: "run_status", run_id: 3, status: "failed", has_error: true, reason: "ValueError" },
    { type: "experiment_end" },
  ];
  return raw.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent);
}

/** A comparable summary of everything the view shows. */
function summary(state: ReturnType<typeof createState>) {
  return {
    lastSeq: state.lastSeq,
    experiment: state.experiment,
    ended: state.ended,
    runs: [...state.runs.values()].sort((a, b) => a.id - b.id).map((r) => ({ ...r })),
    trainMetrics: [...state.trainMetrics].sort(),
    evalMetrics: [...state.evalMetrics].sort(),
    time: state.time,
  };
}

function seededShuffle<T>(items: T[], seed: number): T[] {
  const out = [...items];
  let s = seed >>> 0;
  for (let i = out.length - 1; i > 0; i--) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    const j = s % (i + 1);
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

describe("ingest", () => {
  it("applies an in-order log and derives run state", () => {
    const state = createState();
    const r = ingest(state, experimentLog());
    expect(r.applied).toBe(21);
    expect(state.lastSeq).toBe(21);
    expect(state.experiment).toBe("sft-demo");
    expect(state.ended).toBe(true);
    const run1 = state.runs.get(1)!;
    expect(run1.status).toBe("pending");
    expect(run1.train.loss).toMatchObject({ x: [8, 16], y: [3.0, 2.5] });
    expect(run1.eval.eval_loss).toMatchObject({ x: [16], y: [2.8] });
    expect(run1.latest.loss).toBe(2.5);
    expect(run1.best.loss).toBe(2.5);
    expect(run1.completedSteps).toBe(2);
    expect(run1.chunksDone).toBe(1);
    const run2 = state.runs.get(2)!;
    expect(run2.status).toBe("stopped");
    expect(run2.reason).toBe("stopped by user");
    expect(run2.lastOp).toEqual({ op: "stop", accepted: true, reason: null });
    const run3 = state.runs.get(3)!;
    expect(run3.parent).toBe(1);
    expect(run3.warmStart).toBe(true);
    expect(run3.samplesSeen).toBe(16);
    expect(run3.hasError).toBe(true);
    expect(state.time.train).toBeCloseTo(1.5);
    expect(state.time.swap).toBeCloseTo(0.15);
    expect([...state.evalMetrics].sort()).toEqual(["eval_loss", "eval_runtime"]);
  });

  it("ignores duplicates: pushing and pulling the same events changes nothing", () => {
    const once = createState();
    ingest(once, experimentLog());
    const twice = createState();
    const log = experimentLog();
    ingest(twice, log.slice(0, 12));
    const r = ingest(twice, log); // a pull from 0 after a push of the first 12
    expect(r.duplicates).toBe(12);
    ingest(twice, log.slice(5, 15));
    expect(summary(twice)).toEqual(summary(once));
    // train curves are plotted against samples seen (as eval curves and the trackers), not steps
    expect(twice.runs.get(1)!.train.loss.x).toEqual([8, 16]);
  });

  it("buffers events after a gap and applies them once the gap is filled", () => {
    const state = createState();
    const log = experimentLog();
    ingest(state, log.slice(0, 5));
    const r = ingest(state, log.slice(8, 12)); // seqs 9..12 arrive before 6..8
    expect(r.applied).toBe(0);
    expect(r.buffered).toBe(4);
    expect(state.lastSeq).toBe(5);
    expect(needsPull(state)).toBe(true);
    expect(state.knownSeq).toBe(12);
    ingest(state, log.slice(5, 8));
    expect(state.lastSeq).toBe(12);
    expect(state.pending.size).toBe(0);
    expect(needsPull(state)).toBe(false);
  });

  it("reaches the same state for any arrival order, with duplicates", () => {
    const reference = createState();
    ingest(reference, experimentLog());
    for (let seed = 1; seed <= 50; seed++) {
      const log = experimentLog();
      const deliveries = seededShuffle([...log, ...log.slice(0, seed % log.length)], seed);
      const state = createState();
      // Deliver in batches of varying size, as pushes and pulls would.
      for (let i = 0; i < deliveries.length; i += 1 + (seed % 4)) ingest(state, deliveries.slice(i, i + 1 + (seed % 4)));
      expect(summary(state)).toEqual(summary(reference));
    }
  });

  it("rejects malformed events without breaking the state", () => {
    const state = createState();
    const r = ingest(state, [null, 7, "x", { seq: "1", type: "metric" }, { seq: 1.5, type: "x" }, { seq: 0, type: "x" }, { type: "x" }]);
    expect(r.invalid).toBe(7);
    expect(state.lastSeq).toBe(0);
    expect(ingest(state, "not a list").applied).toBe(0);
    // Unknown types and bad payloads still consume their seq, so later events are not stuck.
    ingest(state, [
      { seq: 1, type: "future_event_type", whatever: 1 },
      { seq: 2, type: "metric", run_id: "1", metrics: { loss: 1 } },
      { seq: 3, type: "metric", run_id: 1, split: "train", step: 1, samples_seen: 4, metrics: { loss: "NaN", note: [1], acc: null } },
    ]);
    expect(state.lastSeq).toBe(3);
    expect(state.runs.get(1)!.train.acc).toMatchObject({ x: [4], y: [null] });
    expect(state.runs.get(1)!.train.loss).toBeUndefined();
  });

  it("does not invent a run for a refused op on an unknown run id", () => {
    const state = createState();
    ingest(state, [{ seq: 1, type: "op", op: "stop", run_id: 99, accepted: false, reason: "no run 99" }]);
    expect(state.runs.size).toBe(0);
    expect(state.lastSeq).toBe(1);
  });

  it("caps the out-of-order buffer", () => {
    const state = createState();
    const far = Array.from({ length: MAX_PENDING + 100 }, (_, i) => ({ seq: i + 10, type: "experiment_end" }));
    ingest(state, far);
    expect(state.pending.size).toBe(MAX_PENDING);
    expect(needsPull(state)).toBe(true);
  });
});

describe("snapshot and late render", () => {
  it("a view rendered late rebuilds from snapshot plus a pull from 0", () => {
    const live = createState();
    const log = experimentLog();
    for (const e of log) ingest(live, [e]);

    const late = createState();
    applySnapshot(late, { protocol: 1, experiment: "sft-demo", path: "/tmp/x", last_seq: 21, runs: { 1: "pending" } });
    expect(late.experiment).toBe("sft-demo");
    expect(needsPull(late)).toBe(true);
    // Pull replies come back in capped batches.
    for (let since = 0; since < log.length; since += 8) {
      noteKnownSeq(late, 21);
      ingest(late, log.slice(since, since + 8));
    }
    expect(needsPull(late)).toBe(false);
    expect(summary(late)).toEqual(summary(live));
  });

  it("ignores malformed snapshots and never lowers the known seq", () => {
    const state = createState();
    applySnapshot(state, { last_seq: 10 });
    applySnapshot(state, { last_seq: 3 });
    applySnapshot(state, null);
    applySnapshot(state, { last_seq: "20", experiment: 5 });
    expect(state.knownSeq).toBe(10);
    expect(state.experiment).toBe(null);
  });
});

describe("chart plans", () => {
  it("draws once, then only appends new points and adds new runs", () => {
    const state = createState();
    const log = experimentLog();
    const book = createChartBook("train", "loss");
    ingest(state, log.slice(0, 8));
    let plan = planChart(state, book);
    expect(plan.reset).toBe(true);
    expect(plan.traces.map((t) => [t.runId, t.x])).toEqual([[1, [8, 16]]]);
    expect(planIsEmpty(planChart(state, book))).toBe(true);

    ingest(state, log.slice(8, 14));
    plan = planChart(state, book);
    expect(plan.reset).toBe(false);
    expect(plan.add.map((t) => [t.runId, t.x, t.y])).toEqual([[2, [8, 16], [3.1, 2.9]]]);
    expect(plan.extend.indices).toEqual([]);

    ingest(state, [{ seq: 22, type: "metric", run_id: 1, split: "train", step: 3, samples_seen: 24, metrics: { loss: 2.2 } }]);
    ingest(state, log.slice(14));
    plan = planChart(state, book);
    expect(plan.reset).toBe(false);
    expect(plan.extend).toEqual({ indices: [0], x: [[24]], y: [[2.2]] });
    expect(plan.add).toEqual([]);
  });

  it("redraws when the metric changes and renames and fades deleted runs", () => {
    const state = createState();
    ingest(state, experimentLog());
    const book = createChartBook("eval", "eval_loss");
    planChart(state, book);
    book.metric = "eval_runtime";
    const plan = planChart(state, book);
    expect(plan.reset).toBe(true);
    expect(plan.traces.map((t) => t.runId)).toEqual([1]);

    book.metric = "eval_loss";
    planChart(state, book);
    ingest(state, [{ seq: 22, type: "run_status", run_id: 2, status: "deleted", has_error: false, reason: null }]);
    const restyle = planChart(state, book);
    expect(restyle.restyle).toEqual({ indices: [1], name: ["2 · lr 1e-4 (deleted)"], faded: [true] });
  });

  it("uses the same colour for a run everywhere", () => {
    expect(runColor(1)).toBe(runColor(1));
    expect(runColor(1)).not.toBe(runColor(2));
    const state = createState();
    ingest(state, experimentLog());
    const a = planChart(state, createChartBook("train", "loss"));
    const b = planChart(state, createChartBook("eval", "eval_loss"));
    expect(a.traces.find((t) => t.runId === 2)!.color).toBe(b.traces.find((t) => t.runId === 2)!.color);
  });
});

describe("derived view data", () => {
  it("enables only legal ops", () => {
    expect(legalOps("running")).toEqual({ stop: true, resume: false, delete: true, clone: true });
    expect(legalOps("pending")).toEqual({ stop: true, resume: false, delete: true, clone: true });
    expect(legalOps("stopped")).toEqual({ stop: false, resume: true, delete: true, clone: true });
    expect(legalOps("completed")).toEqual({ stop: false, resume: false, delete: true, clone: true });
    expect(legalOps("failed")).toEqual({ stop: false, resume: false, delete: true, clone: true });
    expect(legalOps("deleted")).toEqual({ stop: false, resume: false, delete: false, clone: false });
  });

  it("lists knob columns and the default metric", () => {
    const state = createState();
    ingest(state, experimentLog());
    expect(knobColumns(state)).toEqual(["peft_config.r", "training_args.learning_rate"]);
    expect(shortKnobNames(["peft_config.r", "training_args.learning_rate", "a.seed", "b.seed"])).toEqual({
      "peft_config.r": "r", "training_args.learning_rate": "learning_rate", "a.seed": "a.seed", "b.seed": "b.seed",
    });
    expect(defaultMetric(state.evalMetrics, "eval_loss")).toBe("eval_loss");
    expect(defaultMetric(new Set(["eval_runtime", "eval_accuracy"]), "eval_loss")).toBe("eval_accuracy");
    expect(defaultMetric(new Set(), "eval_loss")).toBe(null);
  });

  it("keeps higher-is-better metrics' best as the maximum", () => {
    const state = createState();
    ingest(state, [
      { seq: 1, type: "metric", run_id: 1, split: "eval", step: 1, samples_seen: 8, metrics: { eval_accuracy: 0.5, eval_loss: 2 } },
      { seq: 2, type: "metric", run_id: 1, split: "eval", step: 2, samples_seen: 16, metrics: { eval_accuracy: 0.7, eval_loss: 3 } },
      { seq: 3, type: "metric", run_id: 1, split: "eval", step: 3, samples_seen: 24, metrics: { eval_accuracy: 0.6, eval_loss: null } },
    ]);
    const run = state.runs.get(1)!;
    expect(run.best).toEqual({ eval_accuracy: 0.7, eval_loss: 2 });
    expect(run.latest).toEqual({ eval_accuracy: 0.6, eval_loss: null });
  });

  it("sums the engine time split from chunk_done events", () => {
    const state = createState();
    ingest(state, experimentLog());
    const fig = timeSplitFigure(state);
    expect(fig.rows).toEqual(["all runs", "run 1", "run 2"]);
    expect(fig.values.train[0]).toBeCloseTo(1.5);
    expect(fig.values.train[1]).toBeCloseTo(0.8);
    expect(fig.total).toBeCloseTo(2.0);
    expect(fig.overhead).toBeCloseTo(0.3 / 2.0);
  });

  it("describes progress", () => {
    const state = createState();
    ingest(state, experimentLog());
    expect(progressText(state.runs.get(1)!)).toBe("epoch 1/1 · chunk 1/4 · step 2/8");
    // run 3 failed before its first chunk; run 4 is a warm clone that has not trained yet
    expect(progressText(state.runs.get(3)!)).toBe("no chunk trained · step 0/8");
    // The engine counts a warm clone's steps on from its parent's data position (base_step):
    // the clone's own progress starts at 0 of its own total, and where its data starts is apart.
    ingest(state, [{ seq: 22, type: "run_created", run_id: 4, knobs: {}, parent_run_id: 1, warm_start: true,
      total_steps: 10, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 16, base_step: 2, base_chunk: 1 }]);
    const clone = state.runs.get(4)!;
    expect(progressText(clone)).toBe("warm start from run 1 · first chunk next · step 0/8");
    expect(progressText(clone)).not.toContain("chunk 0/");
    expect(progressFraction(clone)).toBe(0);
    expect(dataStartText(clone)).toBe("data from chunk 2/4 (where run 1 was)");
    // A 3-epoch warm clone (8 steps an epoch, 2 a chunk) that ends on the stream's epoch 4
    // reads as its own epoch 3 of 3, at its own last step.
    ingest(state, [{ seq: 23, type: "run_created", run_id: 5, knobs: {}, parent_run_id: 1, warm_start: true,
      total_steps: 26, steps_per_epoch: 8, num_chunks: 4, base_samples_seen: 16, base_step: 2, base_chunk: 1 },
    { seq: 24, type: "chunk_done", run_id: 5, completed_steps: 26, total_steps: 26, epoch: 3, chunk: 0, chunks_done: 12 }]);
    expect(progressText(state.runs.get(5)!)).toBe("epoch 3/3 · chunk 1/4 · step 24/24");
    expect(progressFraction(state.runs.get(5)!)).toBe(1);
    // get_runs_info() says 26/26 for that clone: the step's title says why the numbers differ
    expect(stepTitle(state.runs.get(5)!)).toContain("parent's step 2: completed_steps 26 of total_steps 26");
    expect(stepTitle(state.runs.get(1)!)).toBe("");
  });

  it("shows a list knob as names, not clipped JSON", () => {
    expect(knobCellText(["q_proj", "v_proj"])).toBe("q_proj, v_proj");
    expect(knobCellText(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
      .toBe("q_proj, k_proj, v_proj +4");
    expect(knobCellText(1e-3)).toBe("0.001");
    expect(knobCellText({ a: 1 })).toBe('{"a":1}');
  });
});

describe("clone editor parsing", () => {
  it("keeps each knob's type", () => {
    expect(parseKnobInput(1e-3, "5e-4")).toEqual({ ok: true, value: 5e-4 });
    expect(parseKnobInput(1e-3, "fast")).toMatchObject({ ok: false });
    expect(parseKnobInput(1e-3, "")).toMatchObject({ ok: false });
    expect(parseKnobInput(8, "Infinity")).toMatchObject({ ok: false });
    expect(parseKnobInput("cosine", "linear")).toEqual({ ok: true, value: "linear" });
    expect(parseKnobInput(true, "false")).toEqual({ ok: true, value: false });
    expect(parseKnobInput(true, "no")).toMatchObject({ ok: false });
    expect(parseKnobInput(["q_proj"], '["q_proj", "v_proj"]')).toEqual({ ok: true, value: ["q_proj", "v_proj"] });
    expect(parseKnobInput(["q_proj"], "[q_proj")).toMatchObject({ ok: false });
    expect(parseKnobInput(null, "all-linear")).toEqual({ ok: true, value: "all-linear" });
    expect(parseKnobInput(null, "")).toEqual({ ok: true, value: null });
  });

  it("sends only changed knobs and reports field errors", () => {
    const original = { "training_args.learning_rate": 1e-3, "peft_config.r": 8, "training_args.lr_scheduler_type": "linear" };
    const { changes, errors } = knobChanges(original, {
      "training_args.learning_rate": "0.0005",
      "peft_config.r": "8",
      "training_args.lr_scheduler_type": "linear",
      "not.a.knob": "1",
    });
    expect(changes).toEqual({ "training_args.learning_rate": 5e-4 });
    expect(errors).toEqual({});
    const bad = knobChanges(original, { "peft_config.r": "eight" });
    expect(bad.errors).toHaveProperty("peft_config.r");
    expect(bad.changes).toEqual({});
  });

  it("finds the knob an error message names", () => {
    const keys = ["training_args.learning_rate", "peft_config.r", "training_args.lr_scheduler_type"];
    expect(knobNamedIn("training_args.learning_rate must be > 0", keys)).toBe("training_args.learning_rate");
    expect(knobNamedIn("invalid value for r: -1", keys)).toBe("peft_config.r");
    expect(knobNamedIn("something else", keys)).toBe(null);
  });
});

describe("what a newcomer reads", () => {
  const run = (id: number, knobs: Record<string, unknown>, status: string) => [
    { type: "run_created", run_id: id, trainer_type: "SFT", knobs, total_steps: 8, num_chunks: 4 },
    { type: "run_status", run_id: id, status, has_error: false, reason: null },
  ];
  const numbered = (evs: Record<string, unknown>[]) => evs.map((e, i) => ({ seq: i + 1, ...e }));

  it("shows only the knobs that differ between the runs shown", () => {
    const state = createState();
    ingest(state, numbered([
      ...run(1, { "training_args.learning_rate": 1e-3, "peft_config.r": 8, "training_args.max_length": 64 }, "running"),
      ...run(2, { "training_args.learning_rate": 1e-4, "peft_config.r": 8, "training_args.max_length": 64 }, "pending"),
      ...run(3, { "training_args.learning_rate": 1e-4, "peft_config.r": 16, "training_args.max_length": 64 }, "deleted"),
    ]));
    // r differs only on a deleted run; max_length never differs
    expect(knobColumns(state)).toEqual(["training_args.learning_rate"]);
  });

  it("counts the runs in get_runs_info()'s status words", () => {
    const state = createState();
    ingest(state, numbered([...run(1, {}, "running"), ...run(2, {}, "running"), ...run(3, {}, "pending"),
      ...run(4, {}, "stopped")]));
    // two runs have started, one of them has the device: the count says so, in the same words
    expect(headerCounts(state).map(([t]) => t)).toEqual(["2 running (1 on device)", "1 pending", "1 stopped"]);
    expect(headerCounts(state).map(([t]) => t).join(" ")).not.toMatch(/training|waiting/);
    // the running count's title names the run on the device (run 2 took it last)
    expect(headerCountTitle(state, "running")).toMatch(/^run 2 has the device now/);
    expect(headerCountTitle(state, "pending")).toContain("wait for their turn");
    ingest(state, [{ seq: 9, type: "experiment_end" }]);
    expect(headerCounts(state).map(([t]) => t)).toEqual(["2 running", "1 pending", "1 stopped"]);
    expect(headerCountTitle(state, "running")).not.toContain("device now");   // nothing trains once ended
  });

  it("badges say the status as get_runs_info() does; one row is marked on the device", () => {
    const state = createState();
    ingest(state, numbered([...run(1, {}, "running"), ...run(2, {}, "running"), ...run(3, {}, "pending"),
      ...run(4, {}, "stopped")]));
    const badges = () => [1, 2, 3, 4].map((id) => statusBadge(state.runs.get(id)!, state).text);
    const device = () => [1, 2, 3, 4].filter((id) => statusBadge(state.runs.get(id)!, state).onDevice);
    expect(badges()).toEqual(["running", "running", "pending", "stopped"]);
    // No word from Python yet: the run that took the device last (run 2 turned running last).
    expect(device()).toEqual([2]);
    // A chunk of run 1 ends: its adapter is the one loaded.
    ingest(state, [{ seq: 9, type: "chunk_done", run_id: 1, completed_steps: 2, chunks_done: 1 }]);
    expect(device()).toEqual([1]);
    // Python's snapshot names the run on the device; it wins.
    applySnapshot(state, { on_device: 2 });
    expect(device()).toEqual([2]);
    expect(badges()).toEqual(["running", "running", "pending", "stopped"]);
    // on_device naming a run that is not running (stopped meanwhile) falls back to the rule above.
    noteOnDevice(state, 4);
    expect(device()).toEqual([1]);
    ingest(state, [{ seq: 10, type: "experiment_end" }]);
    expect(device()).toEqual([]);
  });

  it("a run with a queued op says so and its buttons follow the op (stopping…)", () => {
    const state = createState();
    ingest(state, numbered([...run(1, {}, "running"), ...run(2, {}, "stopped"), ...run(3, {}, "pending")]));
    expect(noteQueued(state, [["stop", 1], ["resume", 2], ["delete", 3]])).toBe(true);
    expect([1, 2, 3].map((id) => statusBadge(state.runs.get(id)!, state).text)).toEqual(["stopping…", "resuming…", "deleting…"]);
    expect(legalOps("running", state.queued.get(1)!)).toEqual({ stop: false, resume: true, delete: true, clone: true });
    expect(legalOps("stopped", state.queued.get(2)!)).toMatchObject({ stop: true, resume: false });
    expect(legalOps("pending", state.queued.get(3)!)).toMatchObject({ stop: false, resume: false, delete: false });
    // The same list again changes nothing; malformed entries are ignored.
    expect(noteQueued(state, [["stop", 1], ["resume", 2], ["delete", 3], ["eval", 1], ["stop", "1"], 7])).toBe(false);
    // Applied at the boundary: Python's list is empty, and the badge is the status again.
    ingest(state, [{ seq: 7, type: "run_status", run_id: 1, status: "stopped" }]);
    expect(noteQueued(state, [])).toBe(true);
    expect(statusBadge(state.runs.get(1)!, state).text).toBe("stopped");
    applySnapshot(state, { queued: [["stop", 3]] });
    expect(statusBadge(state.runs.get(3)!, state).text).toBe("stopping…");
  });

  it("a pruned run's badge says pruned, as the header counts it", () => {
    const state = createState();
    ingest(state, numbered([...run(1, {}, "running"),
      { type: "run_status", run_id: 1, status: "stopped", reason: "pruned at chunk 2 (median rule)", pruned: true }]));
    expect(statusBadge(state.runs.get(1)!, state).text).toBe("pruned");
    expect(headerCounts(state).map(([t]) => t)).toEqual(["1 pruned"]);
  });

  it("says what an empty chart waits for", () => {
    const state = createState();
    expect(waitingText(state, "train")).toContain("waiting for the runs");
    ingest(state, numbered(run(1, {}, "running")));
    expect(waitingText(state, "train")).toContain("first chunk");
    expect(waitingText(state, "eval")).toContain("first chunk");
  });

  it("labels knobs for people and orders the clone form", () => {
    expect(readableKnob("training_args.learning_rate")).toBe("learning rate");
    expect(readableKnob("training_args.per_device_train_batch_size")).toBe("batch size");
    expect(readableKnob("peft_config.r")).toBe("LoRA rank");
    const keys = ["training_args.use_cpu", "training_args.max_length", "peft_config.r",
      "training_args.learning_rate", "peft_config.lora_alpha"];
    expect(cloneFormKnobs(keys, ["peft_config.r", "training_args.learning_rate"])).toEqual({
      main: ["peft_config.r", "training_args.learning_rate"],
      more: ["training_args.max_length", "peft_config.lora_alpha"],
    });
    // nothing varies: the learning rate first; use_cpu never shows
    const single = cloneFormKnobs(keys, []);
    expect(single.main).toEqual(["training_args.learning_rate"]);
    expect([...single.main, ...single.more]).not.toContain("training_args.use_cpu");
  });
});

describe("metric and knob names that are Object.prototype members", () => {
  const NAMES = ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf", "isPrototypeOf"];
  it("folds them like any other name", () => {
    const state = createState();
    // As the view receives them: JSON.parse makes "__proto__" an own key.
    const events = JSON.parse(JSON.stringify([
      { seq: 1, type: "run_created", run_id: 1, total_steps: 4, num_chunks: 2 },
      { seq: 2, type: "metric", run_id: 1, split: "train", step: 1, samples_seen: 8, metrics: {} },
      { seq: 3, type: "metric", run_id: 1, split: "eval", step: 2, samples_seen: 16, metrics: {} },
      { seq: 4, type: "metric", run_id: 1, split: "eval", step: 4, samples_seen: 32, metrics: {} },
      { seq: 5, type: "run_created", run_id: 2, total_steps: 4, num_chunks: 2 },
    ]).replace(/"metrics":\{\}/g, `"metrics":{${NAMES.map((n, i) => `"${n}":${i + 1}`).join(",")}}`)
      .replace(/"run_id":2,/, `"run_id":2,"knobs":{"constructor":1,"__proto__":2},`));
    expect(Object.keys(events[1].metrics)).toEqual(NAMES);
    const r = ingest(state, events);
    expect(r.applied).toBe(5);
    expect(state.lastSeq).toBe(5);
    const run = state.runs.get(1)!;
    for (const [i, n] of NAMES.entries()) {
      expect(run.latest[n]).toBe(i + 1);
      expect(run.train[n]).toMatchObject({ x: [8], y: [i + 1] });
      expect(run.eval[n]).toMatchObject({ x: [16, 32], y: [i + 1, i + 1] });
      expect(state.evalMetrics.has(n)).toBe(true);
    }
    // "constructor" counts as higher-is-better: the best of equal values stays.
    expect(run.best["constructor"]).toBe(1);
    expect(Object.getPrototypeOf(run.latest)).toBe(null);
    expect(Object.keys(state.runs.get(2)!.knobs).sort()).toEqual(["__proto__", "constructor"]);
    // The next event still applies (lastSeq does not stick) and charts plan the names.
    ingest(state, [{ seq: 6, type: "chunk_done", run_id: 1, completed_steps: 2, chunks_done: 1, epoch: 0, chunk: 0 }]);
    expect(state.lastSeq).toBe(6);
    const book = createChartBook("eval", "constructor");
    expect(() => planChart(state, book)).not.toThrow();
    expect(sortRuns([...state.runs.values()], { column: "eval", descending: false }, "toString")).toEqual([1, 2]);
    expect(knobColumns(state)).toEqual(["__proto__", "constructor"]);
  });
});
