/**
 * The panel's state, rebuilt from the experiment's event log: no DOM, no Plotly, no widget model,
 * so vitest can drive it with event sequences (snapshot + deltas, duplicates, gaps, late render).
 *
 * Events arrive twice over (pushed by Python's publisher thread and pulled by the view's timer) and
 * possibly out of order; `ingest` applies each seq exactly once, in seq order, buffering what comes
 * after a gap until the gap is filled.
 *
 * `applyEvent` mirrors Python's one reducer, rapidfire_nb/engine/state.py (`reduce`), field for
 * field for what the view shows, and is shaped like it: the same dispatch order and one handler
 * per event type, named as Python's helpers are (`_chunk_done` is `chunkDone`), so a change to
 * one side finds its counterpart on the other. The event schema is rapidfire_nb/engine/events_schema.json, as
 * trimmed for the wire by rapidfire_nb/notebook/_panel_protocol.py (`run_status.error` becomes
 * `has_error`; `run_created.config` is dropped). js/test/state_fixtures.test.ts folds the same
 * recorded logs as tests/engine/test_state.py and compares `viewTable` with the same expected tables.
 * Every curve, train and eval, is plotted against samples seen (engine/state.py's x axis).
 *
 * Only the fold lives here; what the view derives from it lives beside it: ./table.ts (the run
 * table's columns, badges, sort and held order), ./chartplan.ts (what the charts draw),
 * ./format.ts (number, knob and progress text) and ./palette.ts (run and status colours).
 */

export type RunStatus = "pending" | "running" | "stopped" | "completed" | "failed" | "deleted";

export interface WireEvent {
  seq: number;
  type: string;
  time?: number;
  [key: string]: unknown;
}

export interface Series {
  x: number[];
  y: (number | null)[];
  /** The optimizer step of each point (null where the event had none): the "optimizer step" x axis. */
  step: (number | null)[];
  /** When each point was logged (Unix seconds, null where unknown): the "wall time" x axis. */
  t: (number | null)[];
}

export interface TimeSplit {
  train: number;
  eval: number;
  /** Generating the sample prompts' completions (chunk_done's `gen_s`; absent in older logs). */
  generate: number;
  swap: number;
  other: number;
}

/** The engine's TIME_KEYS, in its order, and the chunk_done field each one sums. */
export const TIME_FIELDS: [keyof TimeSplit, string][] = [
  ["train", "train_s"], ["eval", "eval_s"], ["generate", "gen_s"], ["swap", "swap_s"], ["other", "other_s"],
];

/**
 * One `generation` event of a run, as Python's table keeps it (run["generations"]): what the run
 * generated for the experiment's sample prompts after a chunk, one text per prompt.
 */
export interface Generation {
  epoch: number | null;
  chunk: number | null;
  step: number | null;
  /** Where the run was in the data (the x of the same chunk's eval point); null when not logged. */
  samples_seen: number | null;
  /** The run's completion of each prompt, aligned with `prompts`. */
  texts: string[];
  /**
   * The prompts it answered and their references (shared with `PanelState.samplePrompts` while
   * they are the same: a resumed experiment may ask other prompts).
   */
  prompts: string[];
  references: (string | null)[];
}

/** The prompts every run generates for, as the latest generation event lists them. */
export interface SamplePrompts {
  prompts: string[];
  /** The expected answer per prompt where the eval set has one. */
  references: (string | null)[];
}

export interface RunState {
  id: number;
  /** A run_created event was applied (a run known only from other events has none). */
  created: boolean;
  status: RunStatus;
  trainerType: string;
  knobs: Record<string, unknown>;
  /** The short leaves of the run's config by knob name (the wire's `run_created.settings`). */
  settings: Record<string, unknown>;
  parent: number | null;
  warmStart: boolean;
  totalSteps: number | null;
  numChunks: number | null;
  completedSteps: number;
  samplesSeen: number;
  chunksDone: number;
  /** Epoch and chunk (0-based, as the engine logs them) of the last chunk trained. */
  epoch: number | null;
  chunk: number | null;
  hasError: boolean;
  reason: string | null;
  /** Stopped by a pruner: the stop event's `pruned` field (its reason is free text). */
  pruned: boolean;
  /** pruner_mode="suggest": the pruner's reason for stopping this run, until the user answers. */
  suggestion: string | null;
  /** Latest value of every metric (train and eval), by metric name. */
  latest: Record<string, number | null>;
  /** Best value of every metric so far (see `lowerIsBetter`). */
  best: Record<string, number>;
  /** Train metrics: x = samples seen (the one x axis, as for eval and the trackers). */
  train: Record<string, Series>;
  /** Eval metrics: x = samples seen, so runs compare at equal data. */
  eval: Record<string, Series>;
  time: TimeSplit;
  /** The last IC op the controller applied (or refused) for this run. */
  lastOp: { op: string; accepted: boolean; reason: string | null } | null;
  /** Seq of the event that last put this run on the device (it turned running, or ended a chunk). */
  deviceSeq: number;
  /** The Ray worker (w0, w1, ...) that trained the run's last chunk; null in the kernel engine. */
  worker: string | null;
  /**
   * Where a warm-started clone's data begins: the engine counts its steps on from the parent's
   * position in the data stream (`base_step`, after chunk `base_chunk`, 0-based); the run's own
   * progress is the steps after that.
   */
  baseStep: number;
  baseChunk: number | null;
  stepsPerEpoch: number | null;
  /** The user's note on the run (exp.note or the panel), the latest one; null for none. */
  note: string | null;
  /** Its completions of the sample prompts, one entry per generation event, in log order. */
  generations: Generation[];
}

/** A Ray worker of the experiment (num_workers), as `workers`/`worker_lost` events describe it. */
export interface WorkerInfo {
  worker: string;
  node: string | null;
  device: string | null;
  lost: boolean;
}

/**
 * The fields of a trained chunk (a chunk_done event) that Python's table keeps in "timeline"
 * (engine/state.py TIMELINE_COLUMNS, get_timeline): the panel's chunk timeline draws them.
 */
export const TIMELINE_COLUMNS = [
  "run_id", "epoch", "chunk", "device", "start", "end", "train_s", "eval_s", "gen_s", "swap_s", "setup_s",
  "snapshot_s", "checkpoint_s", "other_s", "completed_steps", "samples_seen", "worker", "moved", "hop_s",
  "tokens", "tokens_per_s", "peak_mem_mb",
] as const;
/** Values as logged (the reducer copies them unchecked, as Python does); readers check types. */
export type TimelineRow = Record<(typeof TIMELINE_COLUMNS)[number], unknown>;

/** A `worker_lost` event: the worker died; `runs` continue elsewhere from their checkpoints. */
export interface WorkerLoss {
  worker: string;
  node: string | null;
  reason: string | null;
  runs: number[];
  chunk_lost: { run_id: number; epoch: number; chunk: number } | null;
  workers_left: number | null;
  time: number | null;
  /** When a later `workers` event listed that name again (a resumed session's new worker); null: lost to the end. */
  until: number | null;
}

export interface PanelState {
  /** Highest seq applied; every seq <= lastSeq has been applied exactly once. */
  lastSeq: number;
  /** Highest seq Python says exists (snapshot trait, pull replies); > lastSeq means pull. */
  knownSeq: number;
  experiment: string | null;
  path: string | null;
  resumed: boolean;
  ended: boolean;
  /** Opened for its results only (Python's `Experiment.open`): nothing here can be steered. */
  readOnly: boolean;
  runs: Map<number, RunState>;
  /** Events after a gap, waiting for the missing seqs. */
  pending: Map<number, WireEvent>;
  trainMetrics: Set<string>;
  evalMetrics: Set<string>;
  time: TimeSplit;
  /** The run on the device, as Python's snapshot or last pull reply says; null when unknown. */
  onDevice: number | null;
  /** Bumped on every applied event; views compare it to skip work. */
  version: number;
  /** Ray workers, first seen first (empty for the in-kernel engine). */
  workers: WorkerInfo[];
  lostWorkers: WorkerLoss[];
  /** One row per chunk_done, in log order (the chunk timeline). */
  timeline: TimelineRow[];
  /** The earliest metric event's time (Unix seconds): wall-time axes count from it. */
  t0: number | null;
  /**
   * Ops accepted but not applied yet (they apply at the run's next chunk boundary), by run id:
   * Python's word from the snapshot, pull replies and op replies (its engine's op queue).
   */
  queued: Map<number, QueuedOp>;
  /** The sample prompts of the latest generation event; null before any. */
  samplePrompts: SamplePrompts | null;
  /** Generation events applied (a view compares it to skip work). */
  generationCount: number;
}

export type QueuedOp = "stop" | "resume" | "delete";
const QUEUED_OPS: QueuedOp[] = ["stop", "resume", "delete"];

export interface IngestResult {
  applied: number;
  duplicates: number;
  buffered: number;
  invalid: number;
  changedRuns: Set<number>;
  newRuns: number[];
  newMetrics: boolean;
  timeChanged: boolean;
}

/** Beyond this many buffered out-of-order events, drop the newest: a pull refetches them. */
export const MAX_PENDING = 20000;

export const STATUSES: RunStatus[] = ["pending", "running", "stopped", "completed", "failed", "deleted"];

export function createState(): PanelState {
  return {
    lastSeq: 0,
    knownSeq: 0,
    experiment: null,
    path: null,
    resumed: false,
    ended: false,
    readOnly: false,
    runs: new Map(),
    pending: new Map(),
    trainMetrics: new Set(),
    evalMetrics: new Set(),
    time: zeroTime(),
    onDevice: null,
    version: 0,
    workers: [],
    lostWorkers: [],
    timeline: [],
    t0: null,
    queued: new Map(),
    samplePrompts: null,
    generationCount: 0,
  };
}

function zeroTime(): TimeSplit {
  return { train: 0, eval: 0, generate: 0, swap: 0, other: 0 };
}

function isInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v);
}

/** A finite number, else null (the wire has no NaN; whatever else was logged reads as none). */
export function finiteNumber(v: unknown): number | null {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

/** An integer, else null. */
export function intOf(v: unknown): number | null {
  return isInt(v) ? v : null;
}

const num = finiteNumber;
const int = intOf;

function str(v: unknown): string | null {
  return typeof v === "string" ? v : null;
}

/** Metrics where smaller is better; everything else (accuracy, reward, ...) is maximised. */
export function lowerIsBetter(metric: string): boolean {
  const m = metric.toLowerCase();
  return /loss|perplexity|ppl|error|wer|cer|mse|mae|rmse/.test(m);
}

/**
 * A string-keyed record without a prototype: metric and knob names come from the user's code
 * (and from whatever folder was opened), and a name such as "constructor" or "__proto__" must
 * read and write an entry like any other, not Object.prototype's member.
 */
export function dict<T>(): Record<string, T> {
  return Object.create(null) as Record<string, T>;
}

/** An own entry of a record (never an inherited member, whatever the record's prototype). */
export function has(record: Record<string, unknown>, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(record, key);
}

/**
 * A run's knobs as set: those its group varies, over every short value its config sets. A knob
 * only a later clone varies reads, for the runs before it, as what their config set (not as the
 * trainer's default); absent only when the config leaves it to the trainer.
 */
export function setKnobs(run: RunState): Record<string, unknown> {
  return Object.assign(dict<unknown>(), run.settings, run.knobs);
}

function newRun(id: number): RunState {
  return {
    id,
    created: false,
    status: "pending",
    trainerType: "",
    knobs: dict(),
    settings: dict(),
    parent: null,
    warmStart: false,
    totalSteps: null,
    numChunks: null,
    completedSteps: 0,
    samplesSeen: 0,
    chunksDone: 0,
    epoch: null,
    chunk: null,
    hasError: false,
    reason: null,
    pruned: false,
    suggestion: null,
    latest: dict(),
    best: dict(),
    train: dict(),
    eval: dict(),
    time: zeroTime(),
    lastOp: null,
    deviceSeq: 0,
    worker: null,
    baseStep: 0,
    baseChunk: null,
    stepsPerEpoch: null,
    note: null,
    generations: [],
  };
}

/** The snapshot trait: `{protocol, experiment, path, last_seq, runs: {id: status}, on_device, queued, read_only}`. */
export function applySnapshot(state: PanelState, snapshot: unknown): void {
  if (!snapshot || typeof snapshot !== "object") return;
  const s = snapshot as Record<string, unknown>;
  if (typeof s.experiment === "string") state.experiment = s.experiment;
  if (typeof s.path === "string") state.path = s.path;
  if (isInt(s.last_seq) && s.last_seq > state.knownSeq) state.knownSeq = s.last_seq;
  if ("on_device" in s) noteOnDevice(state, s.on_device);
  if ("queued" in s) noteQueued(state, s.queued);
  if (typeof s.read_only === "boolean") state.readOnly = s.read_only;
}

/** Python's word on the run on the device (snapshot, pull reply); true when it changed. */
export function noteOnDevice(state: PanelState, value: unknown): boolean {
  const next = isInt(value) ? value : null;
  const changed = next !== state.onDevice;
  state.onDevice = next;
  return changed;
}

/**
 * Python's list of queued ops (`[[op, run_id], ...]`, in queue order); the last op queued for a
 * run is the one it shows. True when the view's copy changed. Anything malformed is ignored.
 */
export function noteQueued(state: PanelState, value: unknown): boolean {
  if (!Array.isArray(value)) return false;
  const next = new Map<number, QueuedOp>();
  for (const item of value) {
    if (!Array.isArray(item) || item.length !== 2) continue;
    const [op, rid] = item as unknown[];
    if (typeof op === "string" && (QUEUED_OPS as string[]).includes(op) && isInt(rid)) next.set(rid, op as QueuedOp);
  }
  const same = next.size === state.queued.size && [...next].every(([k, v]) => state.queued.get(k) === v);
  // Unchanged: the same Map, so a view can tell a change by identity.
  if (!same) state.queued = next;
  return !same;
}

/** Record that Python has events up to `seq` (from a pull reply or a push). */
export function noteKnownSeq(state: PanelState, seq: unknown): void {
  if (isInt(seq) && seq > state.knownSeq) state.knownSeq = seq;
}

/** True when events exist that this view has not applied (a gap or a newer known seq). */
export function needsPull(state: PanelState): boolean {
  return state.pending.size > 0 || state.knownSeq > state.lastSeq;
}

/**
 * Apply a batch of events. Idempotent: a seq at or below `lastSeq`, or already buffered, is a
 * duplicate and ignored; events after a gap are buffered until the gap is filled.
 */
export function ingest(state: PanelState, events: unknown): IngestResult {
  const result: IngestResult = {
    applied: 0,
    duplicates: 0,
    buffered: 0,
    invalid: 0,
    changedRuns: new Set(),
    newRuns: [],
    newMetrics: false,
    timeChanged: false,
  };
  if (!Array.isArray(events)) return result;
  for (const raw of events) {
    if (!raw || typeof raw !== "object" || !isInt((raw as WireEvent).seq) || (raw as WireEvent).seq < 1
        || typeof (raw as WireEvent).type !== "string") {
      result.invalid++;
      continue;
    }
    const ev = raw as WireEvent;
    if (ev.seq <= state.lastSeq || state.pending.has(ev.seq)) {
      result.duplicates++;
      continue;
    }
    state.pending.set(ev.seq, ev);
    result.buffered++;
  }
  // Drain the contiguous run of seqs that follows lastSeq.
  let next = state.pending.get(state.lastSeq + 1);
  while (next !== undefined) {
    state.pending.delete(next.seq);
    result.buffered--;
    applyEvent(state, next, result);
    state.lastSeq = next.seq;
    result.applied++;
    next = state.pending.get(state.lastSeq + 1);
  }
  if (state.lastSeq > state.knownSeq) state.knownSeq = state.lastSeq;
  if (state.pending.size > 0) {
    // Events exist beyond the gap, so Python knows of them: make sure a pull is scheduled.
    const maxPending = Math.max(...state.pending.keys());
    if (maxPending > state.knownSeq) state.knownSeq = maxPending;
  }
  if (state.pending.size > MAX_PENDING) {
    const keys = [...state.pending.keys()].sort((a, b) => a - b);
    for (const k of keys.slice(MAX_PENDING)) state.pending.delete(k);
  }
  if (result.applied > 0) state.version++;
  return result;
}

function runFor(state: PanelState, id: number, result: IngestResult): RunState {
  let run = state.runs.get(id);
  if (!run) {
    run = newRun(id);
    state.runs.set(id, run);
    result.newRuns.push(id);
  }
  result.changedRuns.add(id);
  return run;
}

function pushPoint(
  series: Record<string, Series>, metric: string, x: number, y: number | null, step: number | null, t: number | null,
): void {
  let s = has(series, metric) ? series[metric] : undefined;
  if (!s) {
    s = { x: [], y: [], step: [], t: [] };
    series[metric] = s;
  }
  s.x.push(x);
  s.y.push(y);
  s.step.push(step);
  s.t.push(t);
}

/**
 * Fold one event into the state, as Python's `reduce` does: the events about the experiment
 * first, then (only with a well-formed run id) the events about one run. Unknown event types
 * come from newer engines; ignoring them keeps old views working.
 */
function applyEvent(state: PanelState, ev: WireEvent, result: IngestResult): void {
  const onExperiment = EXPERIMENT_EVENTS.get(ev.type);
  if (onExperiment) {
    onExperiment(state, ev, result);
    return;
  }
  const runId = isInt(ev.run_id) ? ev.run_id : null;
  if (runId === null) return;
  RUN_EVENTS.get(ev.type)?.(state, runId, ev, result);
}

type ExperimentHandler = (state: PanelState, ev: WireEvent, result: IngestResult) => void;
type RunHandler = (state: PanelState, runId: number, ev: WireEvent, result: IngestResult) => void;

// A Map, not an object literal: an event type such as "constructor" must find no handler.
const EXPERIMENT_EVENTS = new Map<string, ExperimentHandler>([
  ["experiment", experiment],
  ["experiment_end", experimentEnd],
  ["workers", workers],
  ["worker_lost", workerLost],
]);

// The first four create a run not seen before, as Python's `_run_for` does; the others only
// describe a run that exists already and invent none.
const RUN_EVENTS = new Map<string, RunHandler>([
  ["run_created", (state, runId, ev, result) => created(runFor(state, runId, result), ev)],
  ["run_status", (state, runId, ev, result) => status(runFor(state, runId, result), ev)],
  ["metric", (state, runId, ev, result) => metric(state, runFor(state, runId, result), ev, result)],
  ["chunk_done", (state, runId, ev, result) => chunkDone(state, runFor(state, runId, result), ev, result)],
  ["op", (state, runId, ev, result) => op(state.runs.get(runId), ev, result)],
  ["note", (state, runId, ev, result) => note(state.runs.get(runId), ev, result)],
  ["generation", (state, runId, ev, result) => generation(state, state.runs.get(runId), ev, result)],
  ["pruning_suggested", (state, runId, ev, result) => pruningSuggested(state.runs.get(runId), ev, result)],
]);

// The handlers, in dispatch order. Where Python's `reduce` handles a type inline (experiment,
// experiment_end, op, note, pruning_suggested), the handler is named after the type.

function experiment(state: PanelState, ev: WireEvent): void {
  if (typeof ev.name === "string") state.experiment = ev.name;
  if (typeof ev.path === "string") state.path = ev.path;
  state.resumed = ev.resumed === true;
  state.ended = false;
}

function experimentEnd(state: PanelState): void {
  state.ended = true;
}

function workers(state: PanelState, ev: WireEvent): void {
  // Logged at each loop start and after replacements: the live workers; lost ones keep their row.
  const list = Array.isArray(ev.workers) ? ev.workers : [];
  for (const info of list) {
    if (!info || typeof info !== "object" || typeof (info as Record<string, unknown>).worker !== "string") continue;
    const rec = info as Record<string, unknown>;
    const row = workerRow(state, rec.worker as string);
    if (typeof rec.node === "string") row.node = rec.node;
    if (typeof rec.device === "string") row.device = rec.device;
    if (row.lost) {
      // A resumed experiment's new pool reuses w0, w1...: listed means live again; the loss
      // stays in lostWorkers, ended here (by log order, not by comparing clocks).
      row.lost = false;
      for (const loss of state.lostWorkers) {
        if (loss.worker === row.worker && loss.until === null) loss.until = num(ev.time) ?? loss.time ?? 0;
      }
    }
  }
}

function workerLost(state: PanelState, ev: WireEvent): void {
  const name = str(ev.worker);
  if (name === null) return;
  const row = workerRow(state, name); // one that died in its constructor was never listed
  row.lost = true;
  const lost = ev.chunk_lost as Record<string, unknown> | null | undefined;
  const chunkLost = lost && typeof lost === "object" && isInt(lost.run_id) && isInt(lost.epoch) && isInt(lost.chunk)
    ? { run_id: lost.run_id, epoch: lost.epoch, chunk: lost.chunk } : null;
  state.lostWorkers.push({
    worker: name,
    node: str(ev.node) || row.node,
    reason: str(ev.reason),
    runs: Array.isArray(ev.runs) ? ev.runs.filter(isInt) : [],
    chunk_lost: chunkLost,
    workers_left: isInt(ev.workers_left) ? ev.workers_left : null,
    time: num(ev.time),
    until: null,
  });
}

function created(run: RunState, ev: WireEvent): void {
  run.created = true;
  run.trainerType = str(ev.trainer_type) ?? run.trainerType;
  if (ev.knobs && typeof ev.knobs === "object" && !Array.isArray(ev.knobs)) {
    run.knobs = Object.assign(dict<unknown>(), ev.knobs as Record<string, unknown>);
  }
  if (ev.settings && typeof ev.settings === "object" && !Array.isArray(ev.settings)) {
    run.settings = Object.assign(dict<unknown>(), ev.settings as Record<string, unknown>);
  }
  run.parent = isInt(ev.parent_run_id) ? ev.parent_run_id : null;
  run.warmStart = ev.warm_start === true;
  run.totalSteps = isInt(ev.total_steps) ? ev.total_steps : null;
  run.numChunks = isInt(ev.num_chunks) ? ev.num_chunks : null;
  const base = int(ev.base_samples_seen);
  if (base !== null && base > run.samplesSeen) run.samplesSeen = base;
  // A warm-started clone continues its parent's data stream from the parent's step.
  const baseStep = int(ev.base_step);
  if (baseStep !== null && baseStep > run.completedSteps) run.completedSteps = baseStep;
  run.baseStep = baseStep !== null && baseStep > 0 ? baseStep : 0;
  run.baseChunk = int(ev.base_chunk);
  const spe = int(ev.steps_per_epoch);
  run.stepsPerEpoch = spe !== null && spe > 0 ? spe : null;
}

function status(run: RunState, ev: WireEvent): void {
  const next = str(ev.status);
  if (next && (STATUSES as string[]).includes(next)) run.status = next as RunStatus;
  // The engine marks a run running when it first takes the device.
  if (next === "running" && isInt(ev.seq)) run.deviceSeq = ev.seq;
  // An error stays with the run (a deleted failed run keeps its traceback) until it trains
  // again, as in engine/state.py.
  if (ev.has_error === true || (typeof ev.error === "string" && ev.error.length > 0)) run.hasError = true;
  else if (next === "pending" || next === "running") run.hasError = false;
  run.reason = str(ev.reason);
  run.pruned = run.status === "stopped" && ev.pruned === true;
}

function metric(state: PanelState, run: RunState, ev: WireEvent, result: IngestResult): void {
  const split = ev.split === "eval" ? "eval" : "train";
  const metrics = ev.metrics && typeof ev.metrics === "object" ? (ev.metrics as Record<string, unknown>) : {};
  const step = int(ev.step);
  const samples = int(ev.samples_seen);
  // Wall-time axes count from the first metric logged (as the report's figures do).
  const time = num(ev.time);
  if (time !== null && (state.t0 === null || time < state.t0)) state.t0 = time;
  if (step !== null && split === "train" && step > run.completedSteps) run.completedSteps = step;
  if (samples !== null && samples > run.samplesSeen) run.samplesSeen = samples;
  // One x axis for both charts: samples seen (engine/state.py's metric_x).
  const x = samples;
  const names = split === "train" ? state.trainMetrics : state.evalMetrics;
  for (const [name, rawValue] of Object.entries(metrics)) {
    const value = num(rawValue);
    // A metric that is not a number at all (a string, a list) has no curve.
    if (value === null && rawValue !== null && typeof rawValue !== "number") continue;
    if (!names.has(name)) {
      names.add(name);
      result.newMetrics = true;
    }
    run.latest[name] = value;
    if (value !== null) {
      const best = has(run.best, name) ? run.best[name] : undefined;
      const better = best === undefined || (lowerIsBetter(name) ? value < best : value > best);
      if (better) run.best[name] = value;
    }
    if (x !== null) pushPoint(split === "train" ? run.train : run.eval, name, x, value, step, time);
  }
}

function chunkDone(state: PanelState, run: RunState, ev: WireEvent, result: IngestResult): void {
  if (isInt(ev.seq)) run.deviceSeq = ev.seq;
  const cs = int(ev.completed_steps);
  if (cs !== null) run.completedSteps = cs;
  const ts = int(ev.total_steps);
  if (ts !== null) run.totalSteps = ts;
  const ss = int(ev.samples_seen);
  if (ss !== null) run.samplesSeen = ss;
  const cd = int(ev.chunks_done);
  if (cd !== null) run.chunksDone = cd;
  if (int(ev.epoch) !== null && int(ev.chunk) !== null) {
    run.epoch = int(ev.epoch);
    run.chunk = int(ev.chunk);
  }
  // The engine logs moved=true for a run's very first chunk too: that one started there.
  const moved = ev.moved === true && run.worker !== null;
  if (typeof ev.worker === "string") run.worker = ev.worker;
  for (const [key, field] of TIME_FIELDS) {
    const v = num(ev[field]);
    if (v !== null && v > 0) {
      run.time[key] += v;
      state.time[key] += v;
    }
  }
  const row = {} as TimelineRow;
  for (const c of TIMELINE_COLUMNS) row[c] = ev[c] ?? null;
  row.moved = moved;
  state.timeline.push(row);
  result.timeChanged = true;
}

function op(run: RunState | undefined, ev: WireEvent, result: IngestResult): void {
  // An op on an unknown run (refused by the controller) must not invent a run row.
  if (!run) return;
  result.changedRuns.add(run.id);
  run.lastOp = { op: str(ev.op) ?? "?", accepted: ev.accepted === true, reason: str(ev.reason) };
  // Confirmed or ignored (or refused because the run ended): the question is answered.
  if (ev.op === "confirm_suggestion" || ev.op === "ignore_suggestion") run.suggestion = null;
}

function note(run: RunState | undefined, ev: WireEvent, result: IngestResult): void {
  if (!run || typeof ev.text !== "string") return;
  result.changedRuns.add(run.id);
  run.note = ev.text || null;
}

function generation(state: PanelState, run: RunState | undefined, ev: WireEvent, result: IngestResult): void {
  // A generation of an unknown run invents no run; one whose texts do not answer its
  // prompts one for one is skipped whole (engine/state.py's _generation).
  const { texts, prompts } = ev;
  if (!run || !strings(texts) || !strings(prompts) || texts.length !== prompts.length) return;
  const refs = Array.isArray(ev.references) && ev.references.length === prompts.length
    ? ev.references.map(str) : prompts.map(() => null);
  let last = state.samplePrompts;
  if (last === null || !sameList(last.prompts, prompts) || !sameList(last.references, refs)) {
    last = state.samplePrompts = { prompts: [...prompts], references: refs };
  }
  result.changedRuns.add(run.id);
  run.generations.push({
    epoch: int(ev.epoch), chunk: int(ev.chunk), step: int(ev.step), samples_seen: int(ev.samples_seen),
    texts: [...texts], prompts: last.prompts, references: last.references,
  });
  state.generationCount++;
}

function pruningSuggested(run: RunState | undefined, ev: WireEvent, result: IngestResult): void {
  if (!run) return;
  result.changedRuns.add(run.id);
  run.suggestion = str(ev.reason) ?? "the pruner would stop this run";
}

function strings(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((x) => typeof x === "string");
}

function sameList<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function workerRow(state: PanelState, name: string): WorkerInfo {
  let row = state.workers.find((w) => w.worker === name);
  if (!row) {
    row = { worker: name, node: null, device: null, lost: false };
    state.workers.push(row);
  }
  return row;
}

/** Fields of a run in Python's table (rapidfire_nb/engine/state.py) that the view mirrors. */
export const VIEW_RUN_FIELDS = [
  "run_id", "created", "status", "reason", "has_error", "pruned", "trainer_type", "knobs",
  "parent_run_id", "warm_start", "total_steps", "num_chunks", "completed_steps", "samples_seen",
  "chunks_done", "last_epoch", "last_chunk", "latest", "best", "series", "time", "last_op",
  "device_seq", "suggestion", "worker", "note", "generations",
] as const;

/** Table-level fields the view mirrors. */
export const VIEW_TABLE_FIELDS = [
  "experiment", "path", "resumed", "ended", "last_seq", "train_metrics", "eval_metrics", "time",
  "workers", "lost_workers", "timeline", "sample_prompts",
] as const;

/** Series as Python's table keeps them: x (samples seen) and y; step and time are the view's own. */
function xy(series: Record<string, Series>): Record<string, { x: number[]; y: (number | null)[] }> {
  const out = dict<{ x: number[]; y: (number | null)[] }>();
  for (const [k, v] of Object.entries(series)) out[k] = { x: v.x, y: v.y };
  return out;
}

/**
 * The state in the shape (and names) of Python's run table, restricted to the fields above: what
 * js/test/state_fixtures.test.ts compares with the expected tables both languages share.
 */
export function viewTable(state: PanelState): Record<string, unknown> {
  const runs: Record<string, unknown> = {};
  for (const r of state.runs.values()) {
    runs[String(r.id)] = {
      run_id: r.id, created: r.created, status: r.status, reason: r.reason, has_error: r.hasError,
      pruned: r.pruned, trainer_type: r.trainerType, knobs: r.knobs, parent_run_id: r.parent,
      warm_start: r.warmStart, total_steps: r.totalSteps, num_chunks: r.numChunks,
      completed_steps: r.completedSteps, samples_seen: r.samplesSeen, chunks_done: r.chunksDone,
      last_epoch: r.epoch, last_chunk: r.chunk, latest: r.latest, best: r.best,
      series: { train: xy(r.train), eval: xy(r.eval) }, time: r.time, last_op: r.lastOp, device_seq: r.deviceSeq,
      suggestion: r.suggestion, worker: r.worker, note: r.note, generations: r.generations,
    };
  }
  return {
    experiment: state.experiment, path: state.path, resumed: state.resumed, ended: state.ended,
    last_seq: state.lastSeq, train_metrics: [...state.trainMetrics], eval_metrics: [...state.evalMetrics],
    time: state.time, workers: state.workers, lost_workers: state.lostWorkers,
    timeline: state.timeline, sample_prompts: state.samplePrompts, runs,
  };
}

