/**
 * The panel's state, rebuilt from the experiment's event log: no DOM, no Plotly, no widget model,
 * so vitest can drive it with event sequences (snapshot + deltas, duplicates, gaps, late render).
 *
 * Events arrive twice over (pushed by Python's publisher thread and pulled by the view's timer) and
 * possibly out of order; `ingest` applies each seq exactly once, in seq order, buffering what comes
 * after a gap until the gap is filled.
 *
 * `applyEvent` mirrors Python's one reducer, rapidfire_nb/engine/state.py (`reduce`), field for
 * field for what the view shows; the event schema is rapidfire_nb/engine/events_schema.json, as
 * trimmed for the wire by rapidfire_nb/notebook/_panel_protocol.py (`run_status.error` becomes
 * `has_error`; `run_created.config` is dropped). js/test/state_fixtures.test.ts folds the same
 * recorded logs as tests/test_state.py and compares `viewTable` with the same expected tables.
 * Every curve, train and eval, is plotted against samples seen (engine/state.py's x axis).
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
}

export interface TimeSplit {
  train: number;
  eval: number;
  swap: number;
  other: number;
}

export interface RunState {
  id: number;
  /** A run_created event was applied (a run known only from other events has none). */
  created: boolean;
  status: RunStatus;
  trainerType: string;
  knobs: Record<string, unknown>;
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
  /** Stopped by a pruner (the event's `pruned` field or "pruned" in its reason/error). */
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
  "run_id", "epoch", "chunk", "device", "start", "end", "train_s", "eval_s", "swap_s", "setup_s",
  "snapshot_s", "checkpoint_s", "other_s", "completed_steps", "samples_seen", "worker", "moved", "hop_s",
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
}

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
  };
}

function zeroTime(): TimeSplit {
  return { train: 0, eval: 0, swap: 0, other: 0 };
}

function isInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v);
}

function num(v: unknown): number | null {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

function int(v: unknown): number | null {
  return isInt(v) ? v : null;
}

function str(v: unknown): string | null {
  return typeof v === "string" ? v : null;
}

/** Metrics where smaller is better; everything else (accuracy, reward, ...) is maximised. */
export function lowerIsBetter(metric: string): boolean {
  const m = metric.toLowerCase();
  return /loss|perplexity|ppl|error|wer|cer|mse|mae|rmse/.test(m);
}

/** Bookkeeping metrics HF logs beside the real ones; not worth a "best". */
export function isBookkeepingMetric(metric: string): boolean {
  return /(_runtime|_per_second|^epoch$|^step$|^total_flos$|num_tokens)/.test(metric);
}

function newRun(id: number): RunState {
  return {
    id,
    created: false,
    status: "pending",
    trainerType: "",
    knobs: {},
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
    latest: {},
    best: {},
    train: {},
    eval: {},
    time: zeroTime(),
    lastOp: null,
    deviceSeq: 0,
    worker: null,
  };
}

/** The snapshot trait: `{protocol, experiment, path, last_seq, runs: {id: status}}`. */
export function applySnapshot(state: PanelState, snapshot: unknown): void {
  if (!snapshot || typeof snapshot !== "object") return;
  const s = snapshot as Record<string, unknown>;
  if (typeof s.experiment === "string") state.experiment = s.experiment;
  if (typeof s.path === "string") state.path = s.path;
  if (isInt(s.last_seq) && s.last_seq > state.knownSeq) state.knownSeq = s.last_seq;
  if ("on_device" in s) noteOnDevice(state, s.on_device);
}

/** Python's word on the run on the device (snapshot, pull reply); true when it changed. */
export function noteOnDevice(state: PanelState, value: unknown): boolean {
  const next = isInt(value) ? value : null;
  const changed = next !== state.onDevice;
  state.onDevice = next;
  return changed;
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

function pushPoint(series: Record<string, Series>, metric: string, x: number, y: number | null): void {
  let s = series[metric];
  if (!s) {
    s = { x: [], y: [] };
    series[metric] = s;
  }
  s.x.push(x);
  s.y.push(y);
}

function applyEvent(state: PanelState, ev: WireEvent, result: IngestResult): void {
  const runId = isInt(ev.run_id) ? ev.run_id : null;
  switch (ev.type) {
    case "experiment": {
      if (typeof ev.name === "string") state.experiment = ev.name;
      if (typeof ev.path === "string") state.path = ev.path;
      state.resumed = ev.resumed === true;
      state.ended = false;
      break;
    }
    case "experiment_end":
      state.ended = true;
      break;
    case "run_created": {
      if (runId === null) return;
      const run = runFor(state, runId, result);
      run.created = true;
      run.trainerType = str(ev.trainer_type) ?? run.trainerType;
      if (ev.knobs && typeof ev.knobs === "object" && !Array.isArray(ev.knobs)) {
        run.knobs = { ...(ev.knobs as Record<string, unknown>) };
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
      break;
    }
    case "run_status": {
      if (runId === null) return;
      const run = runFor(state, runId, result);
      const status = str(ev.status);
      if (status && (STATUSES as string[]).includes(status)) run.status = status as RunStatus;
      // The engine marks a run running when it first takes the device.
      if (status === "running" && isInt(ev.seq)) run.deviceSeq = ev.seq;
      // An error stays with the run (a deleted failed run keeps its traceback) until it trains
      // again, as in engine/state.py.
      if (ev.has_error === true || (typeof ev.error === "string" && ev.error.length > 0)) run.hasError = true;
      else if (status === "pending" || status === "running") run.hasError = false;
      run.reason = str(ev.reason);
      run.pruned = run.status === "stopped"
        && (ev.pruned === true || isPrunedText(run.reason) || isPrunedText(str(ev.error)));
      break;
    }
    case "metric": {
      if (runId === null) return;
      const run = runFor(state, runId, result);
      const split = ev.split === "eval" ? "eval" : "train";
      const metrics = ev.metrics && typeof ev.metrics === "object" ? (ev.metrics as Record<string, unknown>) : {};
      const step = int(ev.step);
      const samples = int(ev.samples_seen);
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
          const best = run.best[name];
          const better = best === undefined || (lowerIsBetter(name) ? value < best : value > best);
          if (better) run.best[name] = value;
        }
        if (x !== null) pushPoint(split === "train" ? run.train : run.eval, name, x, value);
      }
      break;
    }
    case "chunk_done": {
      if (runId === null) return;
      const run = runFor(state, runId, result);
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
      for (const key of ["train", "eval", "swap", "other"] as const) {
        const v = num(ev[`${key}_s`]);
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
      break;
    }
    case "op": {
      if (runId === null) return;
      // An op on an unknown run (refused by the controller) must not invent a run row.
      const run = state.runs.get(runId);
      if (!run) return;
      result.changedRuns.add(runId);
      run.lastOp = { op: str(ev.op) ?? "?", accepted: ev.accepted === true, reason: str(ev.reason) };
      // Confirmed or ignored (or refused because the run ended): the question is answered.
      if (ev.op === "confirm_suggestion" || ev.op === "ignore_suggestion") run.suggestion = null;
      break;
    }
    case "pruning_suggested": {
      if (runId === null) return;
      const run = state.runs.get(runId);
      if (!run) return;
      result.changedRuns.add(runId);
      run.suggestion = str(ev.reason) ?? "the pruner would stop this run";
      break;
    }
    case "workers": {
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
      break;
    }
    case "worker_lost": {
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
      break;
    }
    default:
      // Unknown event types come from newer engines; ignoring them keeps old views working.
      break;
  }
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
  "device_seq", "suggestion", "worker",
] as const;

/** Table-level fields the view mirrors. */
export const VIEW_TABLE_FIELDS = [
  "experiment", "path", "resumed", "ended", "last_seq", "train_metrics", "eval_metrics", "time",
  "workers", "lost_workers", "timeline",
] as const;

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
      series: { train: r.train, eval: r.eval }, time: r.time, last_op: r.lastOp, device_seq: r.deviceSeq,
      suggestion: r.suggestion, worker: r.worker,
    };
  }
  return {
    experiment: state.experiment, path: state.path, resumed: state.resumed, ended: state.ended,
    last_seq: state.lastSeq, train_metrics: [...state.trainMetrics], eval_metrics: [...state.evalMetrics],
    time: state.time, workers: state.workers, lost_workers: state.lostWorkers,
    timeline: state.timeline, runs,
  };
}

// ---------------------------------------------------------------------------------------------
// What the view derives from the state.

export interface LegalOps {
  stop: boolean;
  resume: boolean;
  delete: boolean;
  clone: boolean;
}

/** Which buttons a run's status enables (DESIGN §5). */
export function legalOps(status: RunStatus): LegalOps {
  return {
    stop: status === "pending" || status === "running",
    resume: status === "stopped",
    delete: status !== "deleted",
    clone: status !== "deleted",
  };
}

/**
 * Knob columns of the run table: the knobs whose values differ between the runs shown (deleted
 * runs aside), in a stable order. A knob every run shares says nothing about the comparison and
 * would only push the buttons out of view.
 */
export function knobColumns(state: PanelState): string[] {
  const runs = [...state.runs.values()].filter((r) => r.status !== "deleted");
  const keys = new Set<string>();
  for (const run of runs) for (const k of Object.keys(run.knobs)) keys.add(k);
  return [...keys]
    .filter((k) => new Set(runs.map((r) => (k in r.knobs ? JSON.stringify(r.knobs[k]) : "\u0000absent"))).size > 1)
    .sort();
}

/** Column titles: the last part of a dotted knob name, or the whole name where that is ambiguous. */
export function shortKnobNames(keys: string[]): Record<string, string> {
  const last = keys.map((k) => k.split(".").pop()!);
  const out: Record<string, string> = {};
  keys.forEach((k, i) => {
    out[k] = last.filter((l) => l === last[i]).length === 1 ? last[i] : k;
  });
  return out;
}

const LABELS: Record<string, string> = {
  per_device_train_batch_size: "batch size",
  per_device_eval_batch_size: "eval batch size",
  gradient_accumulation_steps: "grad accumulation",
  num_train_epochs: "epochs",
  lr_scheduler_type: "LR schedule",
  r: "LoRA rank",
  lora_alpha: "LoRA alpha",
  lora_dropout: "LoRA dropout",
  target_modules: "target modules",
  max_length: "max length",
};

/** A label a person reads: "training_args.learning_rate" -> "learning rate". */
export function readableKnob(key: string): string {
  const leaf = key.split(".").pop()!;
  return LABELS[leaf] ?? leaf.replace(/_/g, " ");
}

/** Knobs the engine sets for the machine (not the user's to choose in a clone). */
export function isMachineKnob(key: string): boolean {
  return /(^|\.)(use_cpu|no_cuda)$/.test(key);
}

/**
 * The clone form's knob order: the ones that vary across runs first (in column order), then the
 * rest sorted, training arguments before the adapter's; machine knobs left out.
 */
export function cloneFormKnobs(keys: string[], varying: string[]): { main: string[]; more: string[] } {
  const usable = keys.filter((k) => !isMachineKnob(k));
  const main = varying.filter((k) => usable.includes(k));
  const rank = (k: string) => (k.startsWith("training_args.") ? 0 : k.startsWith("peft_config.") ? 1 : 2);
  const more = usable.filter((k) => !main.includes(k)).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  // Nothing varies (a single run): the learning rate is the knob people change first.
  if (main.length === 0) {
    const lr = more.findIndex((k) => k.endsWith("learning_rate"));
    if (lr >= 0) main.push(...more.splice(lr, 1));
  }
  return { main, more };
}

/** "1 training · 2 waiting · 1 stopped": one run trains at a time; the others wait their turn. */
/**
 * The run training now: Python's `on_device` when that run is running; without it (an older
 * kernel, or before the first snapshot), the running run that most recently took the device
 * (turned running, or ended a chunk; its adapter stays loaded until the next run swaps in).
 * None once the experiment ended: nothing trains then.
 */
export function trainingRun(state: PanelState): number | null {
  if (state.ended) return null;
  if (state.onDevice !== null && state.runs.get(state.onDevice)?.status === "running") return state.onDevice;
  let best: RunState | null = null;
  for (const r of state.runs.values()) {
    if (r.status === "running" && (best === null || r.deviceSeq > best.deviceSeq)) best = r;
  }
  return best ? best.id : null;
}

/**
 * A row's badge, in the header's words: the run on the device "training", the other active runs
 * (engine status running or pending) "waiting", a pruned run "pruned". `status` picks the colour.
 */
export function statusBadge(run: RunState, state: PanelState): { text: string; status: RunStatus; title: string } {
  if (run.status === "running" || run.status === "pending") {
    if (run.id === trainingRun(state)) {
      return { text: "training", status: "running", title: "this run has the device now (runs train one chunk at a time)" };
    }
    return {
      text: "waiting", status: "pending",
      title: run.status === "pending"
        ? "not started yet: runs train one chunk at a time on the device, and this one waits for its turn"
        : "runs train one chunk at a time on the device; this one waits for its next turn",
    };
  }
  if (isPruned(run)) return { text: "pruned", status: "stopped", title: run.reason ?? "stopped by the pruner" };
  return { text: run.status, status: run.status, title: run.reason ?? "" };
}

export function headerCounts(state: PanelState): [string, RunStatus][] {
  const c = statusCounts(state);
  const active = c.running + c.pending;
  const out: [string, RunStatus][] = [];
  if (active > 0) {
    // The same rule as the rows' badges, so the counts match what the rows say.
    const training = trainingRun(state) !== null ? 1 : 0;
    if (training) out.push(["1 training", "running"]);
    if (active - training > 0) out.push([`${active - training} waiting`, "pending"]);
  }
  const pruned = [...state.runs.values()].filter(isPruned).length;
  for (const s of ["stopped", "completed", "failed", "deleted"] as RunStatus[]) {
    const n = s === "stopped" ? c[s] - pruned : c[s];
    if (n > 0) out.push([`${n} ${s}`, s]);
    if (s === "stopped" && pruned > 0) out.push([`${pruned} pruned`, "stopped"]);
  }
  return out;
}

/** A metric name as a column header: "eval_loss" -> "eval loss" (the raw name stays in the title). */
export function readableMetric(metric: string): string {
  return metric.replace(/[_.]+/g, " ").trim() || metric;
}

/** Shown in place of a chart that has no point yet. */
export function waitingText(state: PanelState, split: "train" | "eval"): string {
  if (state.runs.size === 0) return "waiting for the runs to be created…";
  const active = [...state.runs.values()].filter((r) => r.status === "running" || r.status === "pending").length;
  if (active === 0) return split === "eval" ? "no eval points (no eval dataset, or no run finished a chunk)" : "no points";
  return split === "train"
    ? "waiting for the first chunk: runs take turns, and a run's loss appears each time it finishes a chunk"
    : "waiting for the first chunk: every run is evaluated after each chunk it trains";
}

export function statusCounts(state: PanelState): Record<RunStatus, number> {
  const counts = { pending: 0, running: 0, stopped: 0, completed: 0, failed: 0, deleted: 0 };
  for (const run of state.runs.values()) counts[run.status]++;
  return counts;
}

/** The eval metric shown by default: eval_loss if any run logged it, else the first real one. */
export function defaultMetric(names: Set<string>, preferred: string): string | null {
  if (names.has(preferred)) return preferred;
  const real = [...names].filter((n) => !isBookkeepingMetric(n)).sort();
  if (real.length) return real[0];
  const all = [...names].sort();
  return all.length ? all[0] : null;
}

/**
 * Run colours: tab10 (less its dark brown), then colours picked greedily for the largest CIEDE2000
 * distance to the others among those readable on both a white page and JupyterLab's dark one: at
 * least 2:1 contrast against white and 3:1 against #212121 (the near-black and light colours of
 * the first palette vanished on one of the two). Any two of the 24 are at least ΔE76 26 apart
 * (js/test/scale.test.ts checks both). Runs past 24 reuse the colours with a dash style, so 96 runs
 * have distinct (colour, dash) pairs; hovering and pinning tell the rest apart.
 */
export const PALETTE = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#87c3a5", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#007878", "#3c784b", "#f032e6", "#7896ff", "#a6761d", "#f99379",
  "#a5694b", "#c2b280", "#b4b4d2", "#e7298a", "#697800", "#b3446c", "#4b5aff", "#e6ab02",
];
export type Dash = "solid" | "dash" | "dot" | "dashdot";
const DASHES: Dash[] = ["solid", "dash", "dot", "dashdot"];

function paletteIndex(runId: number): number {
  return (((runId - 1) % PALETTE.length) + PALETTE.length) % PALETTE.length;
}

/** One colour per run id, the same in every chart, the table and the time split. */
export function runColor(runId: number): string {
  return PALETTE[paletteIndex(runId)];
}

/** The line style that tells apart runs sharing a colour (run 1 and run 25). */
export function runDash(runId: number): Dash {
  const round = Math.floor(Math.max(0, runId - 1) / PALETTE.length);
  return DASHES[round % DASHES.length];
}

/** The dash in words, for titles ("run 25: dashed line"). */
export const DASH_WORDS: Record<Dash, string> = { solid: "solid line", dash: "dashed line", dot: "dotted line", dashdot: "dash-dot line" };

/**
 * A run's key outside the charts: the table swatch's CSS and the time split's glyph. Runs that
 * share a colour (1 and 25) differ by dash on the curves, so the key shows the dash too: a solid
 * square for the first 24, a line sample in the dash pattern (and a matching border) after that.
 */
export function runKey(runId: number): { color: string; dash: Dash; css: Record<string, string>; glyph: string; title: string } {
  const color = runColor(runId);
  const dash = runDash(runId);
  const title = `run ${runId}: ${DASH_WORDS[dash]}`;
  if (dash === "solid") {
    return { color, dash, css: { background: color, borderColor: color, borderStyle: "solid" }, glyph: "■", title };
  }
  const stops: Record<Exclude<Dash, "solid">, string> = {
    dash: `${color} 0 3px, transparent 3px 5px`,
    dot: `${color} 0 1.5px, transparent 1.5px 3px`,
    dashdot: `${color} 0 3px, transparent 3px 4px, ${color} 4px 5px, transparent 5px 6px`,
  };
  return {
    color, dash, title,
    css: {
      background: `repeating-linear-gradient(90deg, ${stops[dash]}) center / 100% 2px no-repeat`,
      borderColor: color,
      borderStyle: dash === "dot" ? "dotted" : "dashed",
    },
    glyph: { dash: "╍╍", dot: "┅┅", dashdot: "╍·" }[dash],
  };
}

/**
 * A pruned run: `stopped` by a pruner, which says so in the run's reason (or error) text, e.g.
 * "pruned at chunk 2", or with an explicit `pruned` field on the event.
 */
export function isPrunedText(text: string | null | undefined): boolean {
  return typeof text === "string" && /\bpruned\b/i.test(text);
}

export function isPruned(run: RunState): boolean {
  return run.status === "stopped" && (run.pruned || isPrunedText(run.reason));
}

/** Runs the table folds into one group row: pruned and deleted ones. */
export function isCollapsible(run: RunState): boolean {
  return run.status === "deleted" || isPruned(run);
}

export interface StatusFilters {
  stopped: boolean;
  pruned: boolean;
  deleted: boolean;
}

/** Whether a run's curves and row show under the "hide ..." filters. */
export function runShown(run: RunState, hide: StatusFilters): boolean {
  if (run.status === "deleted") return !hide.deleted;
  if (isPruned(run)) return !hide.pruned;
  if (run.status === "stopped") return !hide.stopped;
  return true;
}

export type SortColumn = "auto" | "id" | "status" | "progress" | "loss" | "eval";
export interface SortKey {
  column: SortColumn;
  /** true: best / largest first, as the column's header arrow shows. */
  descending: boolean;
}

/** The value a run sorts by in a metric column; undefined sorts last whatever the direction. */
function sortValue(run: RunState, column: SortColumn, metric: string | null): number | undefined {
  switch (column) {
    case "progress":
      return progressFraction(run);
    case "loss":
      return run.latest["loss"] ?? undefined;
    case "eval":
      return metric === null ? undefined : run.best[metric];
    case "status":
      return STATUSES.indexOf(run.status);
    default:
      return run.id;
  }
}

/**
 * "auto" sorts by the best eval metric (best first) once every live run has one (a ranking with
 * gaps would put unevaluated runs in arbitrary places), and by run id until then.
 */
export function effectiveSort(state: PanelState, key: SortKey, metric: string | null): SortKey {
  if (key.column !== "auto") return key;
  const live = [...state.runs.values()].filter((r) => !isCollapsible(r));
  if (metric !== null && live.length > 0 && live.every((r) => r.best[metric] !== undefined)) {
    return { column: "eval", descending: !lowerIsBetter(metric) };
  }
  return { column: "id", descending: false };
}

/** Run ids in table order; ties (and missing values, always last) fall back to the run id. */
export function sortRuns(runs: RunState[], key: SortKey, metric: string | null): number[] {
  const dir = key.descending ? -1 : 1;
  return [...runs]
    .sort((a, b) => {
      const va = sortValue(a, key.column, metric);
      const vb = sortValue(b, key.column, metric);
      if (va === undefined && vb !== undefined) return 1;
      if (vb === undefined && va !== undefined) return -1;
      if (va !== undefined && vb !== undefined && va !== vb) return (va - vb) * dir;
      return a.id - b.id;
    })
    .map((r) => r.id);
}

/**
 * The table order to show. While `hold` is set (the pointer is over the table, or a Delete waits
 * for its confirm) rows keep the places they had: a row that moves between aim and click gets the
 * wrong run stopped (review_panel.md finding 2). Rows that appear go to the end; rows that leave
 * (deleted, filtered) are dropped. Without `hold`, the wanted (sorted) order.
 */
export function heldOrder<T>(previous: readonly T[], wanted: readonly T[], hold: boolean): T[] {
  if (!hold || previous.length === 0) return [...wanted];
  const want = new Set(wanted);
  const kept = previous.filter((id) => want.has(id));
  const have = new Set(kept);
  return [...kept, ...wanted.filter((id) => !have.has(id))];
}

/**
 * Largest-Triangle-Three-Buckets (Steinarsson 2013): keeps `threshold` points, first and last
 * included, choosing in each bucket the point that spans the largest triangle with its neighbours,
 * so spikes and the curve's shape survive. Points with a null y are dropped (a gap in a
 * downsampled line means nothing). x must be ascending.
 */
export function lttb(x: number[], y: (number | null)[], threshold: number): { x: number[]; y: number[] } {
  const xs: number[] = [];
  const ys: number[] = [];
  for (let i = 0; i < x.length; i++) {
    const v = y[i];
    if (v !== null && v !== undefined && Number.isFinite(v)) {
      xs.push(x[i]);
      ys.push(v);
    }
  }
  const n = xs.length;
  if (threshold >= n || threshold < 3) return { x: xs, y: ys };
  const outX = [xs[0]];
  const outY = [ys[0]];
  const every = (n - 2) / (threshold - 2);
  let a = 0;
  for (let i = 0; i < threshold - 2; i++) {
    const start = Math.floor(i * every) + 1;
    const end = Math.min(Math.floor((i + 1) * every) + 1, n - 1);
    // Average of the next bucket (the last point for the last bucket).
    const nStart = end;
    const nEnd = Math.min(Math.floor((i + 2) * every) + 1, n);
    let avgX = 0;
    let avgY = 0;
    for (let j = nStart; j < nEnd; j++) {
      avgX += xs[j];
      avgY += ys[j];
    }
    const cnt = Math.max(1, nEnd - nStart);
    avgX /= cnt;
    avgY /= cnt;
    let best = start;
    let bestArea = -1;
    for (let j = start; j < end; j++) {
      const area = Math.abs((xs[a] - avgX) * (ys[j] - ys[a]) - (xs[a] - xs[j]) * (avgY - ys[a]));
      if (area > bestArea) {
        bestArea = area;
        best = j;
      }
    }
    outX.push(xs[best]);
    outY.push(ys[best]);
    a = best;
  }
  outX.push(xs[n - 1]);
  outY.push(ys[n - 1]);
  return { x: outX, y: outY };
}

/**
 * What a chart draws of one series: the points inside the zoomed x range (plus one on each side,
 * so lines run to the edges), downsampled with LTTB to `maxPoints` when there are more. Zoomed in
 * far enough, that is every logged point.
 */
export function drawnPoints(
  s: Series,
  range: [number, number] | null,
  maxPoints: number,
): { x: number[]; y: (number | null)[]; sampled: boolean } {
  let lo = 0;
  let hi = s.x.length;
  if (range !== null) {
    // One finite point beyond each edge (past a NaN gap if need be): lines run to the edges, and a
    // zoom inside a gap still has the points that fit its y axis.
    const finite = (i: number) => { const v = s.y[i]; return v !== null && Number.isFinite(v); };
    while (lo < s.x.length && s.x[lo] < range[0]) lo++;
    lo = Math.max(0, lo - 1);
    while (lo > 0 && !finite(lo)) lo--;
    hi = lo;
    while (hi < s.x.length && s.x[hi] <= range[1]) hi++;
    while (hi < s.x.length && !finite(hi)) hi++;
    hi = Math.min(s.x.length, hi + 1);
  }
  const x = s.x.slice(lo, hi);
  const y = s.y.slice(lo, hi);
  if (x.length <= maxPoints) return { x, y, sampled: false };
  const d = lttb(x, y, maxPoints);
  return { x: d.x, y: d.y, sampled: true };
}

export const STATUS_COLORS: Record<RunStatus, string> = {
  pending: "#8a8a8a",
  running: "#1a7f37",
  stopped: "#b58900",
  completed: "#0b61a4",
  failed: "#c62828",
  deleted: "#6e6e6e",
};

// ---------------------------------------------------------------------------------------------
// Curves: which traces to add and which points to append, so the view never redraws a chart
// except when the user picks another metric.

export interface TraceSpec {
  runId: number;
  name: string;
  color: string;
  x: number[];
  y: (number | null)[];
  dash: Dash;
  /** Deleted or pruned: drawn fainter. */
  faded: boolean;
}

/**
 * Points a chart draws in all: each canvas pass and each hover lookup walks every drawn point, so
 * the total is bounded whatever the runs log (a chart is a few hundred pixels wide: more points
 * than that per curve do not show). Each trace gets an equal share, between MIN and
 * MAX_TRACE_POINTS (LTTB above it).
 */
export const POINT_BUDGET = 9600;
export const MIN_TRACE_POINTS = 200;
export const MAX_TRACE_POINTS = 1000;

export function tracePointLimit(traces: number): number {
  return Math.max(MIN_TRACE_POINTS, Math.min(MAX_TRACE_POINTS, Math.floor(POINT_BUDGET / Math.max(1, traces))));
}

export interface ChartPlan {
  /** Draw from scratch (first draw, another metric, a new zoom range): `traces` is the whole figure. */
  reset: boolean;
  traces: TraceSpec[];
  /** New traces to add after the existing ones (one per new run). */
  add: TraceSpec[];
  /** Points to append to existing traces, by trace index (traces drawn at full resolution). */
  extend: { indices: number[]; x: number[][]; y: (number | null)[][] };
  /** Traces whose drawn points are replaced (downsampled ones that got new points). */
  replace: { indices: number[]; x: number[][]; y: (number | null)[][] };
  /** Traces whose name or fading changed (a run was deleted or pruned). */
  restyle: { indices: number[]; name: string[]; faded: boolean[] };
}

/** What one chart has drawn: its metric, the run of each trace, points drawn per run. */
export interface ChartBook {
  split: "train" | "eval";
  metric: string | null;
  drawnMetric: string | null;
  order: number[];
  /** Logged points of each run already reflected in its trace. */
  drawn: Map<number, number>;
  /** Runs whose trace holds a downsampled or clipped copy (so new points replace, not append). */
  sampled: Set<number>;
  style: Map<number, string>;
  /** The zoomed x range (null: all); `drawnRange` is the one the traces were drawn for. */
  range: [number, number] | null;
  drawnRange: [number, number] | null;
  maxPoints: number;
}

export function createChartBook(split: "train" | "eval", metric: string | null = null): ChartBook {
  return {
    split, metric, drawnMetric: null, order: [], drawn: new Map(), sampled: new Set(), style: new Map(),
    range: null, drawnRange: null, maxPoints: MAX_TRACE_POINTS,
  };
}

function traceName(run: RunState): string {
  if (run.status === "deleted") return `run ${run.id} (deleted)`;
  return isPruned(run) ? `run ${run.id} (pruned)` : `run ${run.id}`;
}

/**
 * Compare the state with what the chart has drawn and return the minimal update; the book is
 * updated as if the plan were applied (apply it, or reset the book on failure).
 */
export function planChart(state: PanelState, book: ChartBook): ChartPlan {
  const plan: ChartPlan = {
    reset: false,
    traces: [],
    add: [],
    extend: { indices: [], x: [], y: [] },
    replace: { indices: [], x: [], y: [] },
    restyle: { indices: [], name: [], faded: [] },
  };
  const metric = book.metric;
  const seriesOf = (run: RunState): Series | undefined =>
    metric === null ? undefined : (book.split === "train" ? run.train : run.eval)[metric];
  const runsWithData = [...state.runs.values()]
    .filter((run) => (seriesOf(run)?.x.length ?? 0) > 0)
    .sort((a, b) => a.id - b.id);

  const sameRange = JSON.stringify(book.range) === JSON.stringify(book.drawnRange);
  let mustReset = book.drawnMetric !== metric || !sameRange;
  // More runs, fewer points each; redraw only when the share moved by a quarter (runs come in
  // batches as a search expands, so this happens a few times per experiment).
  const limit = tracePointLimit(runsWithData.length);
  if (mustReset || Math.abs(limit - book.maxPoints) > 0.25 * book.maxPoints) {
    mustReset = mustReset || limit !== book.maxPoints;
    book.maxPoints = limit;
  }
  if (!mustReset) {
    for (const run of runsWithData) {
      if ((seriesOf(run)?.x.length ?? 0) < (book.drawn.get(run.id) ?? 0)) mustReset = true;
    }
  }
  const styleKey = (run: RunState) => `${traceName(run)}|${isCollapsible(run)}`;
  const spec = (run: RunState): TraceSpec => {
    const s = seriesOf(run) ?? { x: [], y: [] };
    const d = drawnPoints(s, book.range, book.maxPoints);
    if (d.sampled || book.range !== null) book.sampled.add(run.id);
    else book.sampled.delete(run.id);
    book.drawn.set(run.id, s.x.length);
    return {
      runId: run.id, name: traceName(run), color: runColor(run.id), x: d.x, y: d.y,
      dash: runDash(run.id), faded: isCollapsible(run),
    };
  };
  if (mustReset) {
    plan.reset = true;
    book.drawnMetric = metric;
    book.drawnRange = book.range;
    book.order = [];
    book.drawn = new Map();
    book.sampled = new Set();
    book.style = new Map();
    for (const run of runsWithData) {
      plan.traces.push(spec(run));
      book.order.push(run.id);
      book.style.set(run.id, styleKey(run));
    }
    return plan;
  }
  for (const run of runsWithData) {
    const s = seriesOf(run)!;
    const idx = book.order.indexOf(run.id);
    if (idx < 0) {
      plan.add.push(spec(run));
      book.order.push(run.id);
      book.style.set(run.id, styleKey(run));
      continue;
    }
    const drawn = book.drawn.get(run.id) ?? 0;
    if (s.x.length > drawn) {
      if (!book.sampled.has(run.id) && book.range === null && s.x.length <= book.maxPoints) {
        plan.extend.indices.push(idx);
        plan.extend.x.push(s.x.slice(drawn));
        plan.extend.y.push(s.y.slice(drawn));
        book.drawn.set(run.id, s.x.length);
      } else if (book.sampled.has(run.id) && !newPointsShow(s, drawn, book)) {
        // Leave the trace as drawn: the picture would move by less than one bucket (about a
        // pixel), and an update that redraws nothing is the cheapest one at 48 runs.
      } else {
        const t = spec(run);
        plan.replace.indices.push(idx);
        plan.replace.x.push(t.x);
        plan.replace.y.push(t.y);
      }
    }
    if (book.style.get(run.id) !== styleKey(run)) {
      plan.restyle.indices.push(idx);
      plan.restyle.name.push(traceName(run));
      plan.restyle.faded.push(isCollapsible(run));
      book.style.set(run.id, styleKey(run));
    }
  }
  return plan;
}

/**
 * Whether a downsampled or zoomed trace must be redrawn for the points logged since `drawn`: when
 * zoomed, only points inside the range show; otherwise once they fill one LTTB bucket
 * (length / maxPoints points), since fewer change the drawn line by about a pixel.
 */
export function newPointsShow(s: Series, drawn: number, book: ChartBook): boolean {
  if (book.range !== null) {
    for (let i = drawn; i < s.x.length; i++) if (s.x[i] >= book.range[0] && s.x[i] <= book.range[1]) return true;
    return false;
  }
  return s.x.length - drawn >= Math.max(1, Math.floor(s.x.length / book.maxPoints));
}

export function planIsEmpty(plan: ChartPlan): boolean {
  return !plan.reset && plan.add.length === 0 && plan.extend.indices.length === 0
    && plan.replace.indices.length === 0 && plan.restyle.indices.length === 0;
}

// ---------------------------------------------------------------------------------------------
// Engine time split (train / eval / swap / other), summed from chunk_done events.

export interface TimeSplitFigure {
  categories: (keyof TimeSplit)[];
  rows: string[];
  values: Record<keyof TimeSplit, number[]>;
  total: number;
  /** Share of engine time spent outside training and evaluation (swaps + other), 0..1. */
  overhead: number;
}

export function timeSplitFigure(state: PanelState): TimeSplitFigure {
  const categories: (keyof TimeSplit)[] = ["train", "eval", "swap", "other"];
  const runs = [...state.runs.values()]
    .filter((r) => r.time.train + r.time.eval + r.time.swap + r.time.other > 0)
    .sort((a, b) => a.id - b.id);
  const rows = ["all runs", ...runs.map((r) => `run ${r.id}`)];
  const values = { train: [], eval: [], swap: [], other: [] } as Record<keyof TimeSplit, number[]>;
  for (const c of categories) {
    values[c].push(state.time[c]);
    for (const r of runs) values[c].push(r.time[c]);
  }
  const total = state.time.train + state.time.eval + state.time.swap + state.time.other;
  const overhead = total > 0 ? (state.time.swap + state.time.other) / total : 0;
  return { categories, rows, values, total, overhead };
}

// ---------------------------------------------------------------------------------------------
// Clone editor: turn the text a user typed back into the knob's JSON value.

export type ParseResult = { ok: true; value: unknown } | { ok: false; error: string };

/**
 * Parse an edited knob. The original value's type decides: numbers must stay numbers, booleans
 * booleans, strings are taken verbatim; lists, objects and nulls are read as JSON.
 */
export function parseKnobInput(original: unknown, text: string): ParseResult {
  const t = text.trim();
  if (typeof original === "string") return { ok: true, value: text };
  if (typeof original === "number") {
    if (t === "") return { ok: false, error: "a number is required" };
    const v = Number(t);
    if (!Number.isFinite(v)) return { ok: false, error: `not a number: ${JSON.stringify(text)}` };
    return { ok: true, value: v };
  }
  if (typeof original === "boolean") {
    if (t === "true") return { ok: true, value: true };
    if (t === "false") return { ok: true, value: false };
    return { ok: false, error: "true or false" };
  }
  if (t === "") return { ok: true, value: null };
  try {
    return { ok: true, value: JSON.parse(t) };
  } catch {
    // A null knob (e.g. an unset optional) may well be set to a bare word.
    if (original === null && /^[A-Za-z_][\w.-]*$/.test(t)) return { ok: true, value: t };
    return { ok: false, error: `not valid JSON: ${t.slice(0, 60)}` };
  }
}

export function formatKnobValue(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "number") return String(value);
  return JSON.stringify(value);
}

function jsonEqual(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** The knobs whose parsed value differs from the original: the clone's `changes`. */
export function knobChanges(
  original: Record<string, unknown>,
  edited: Record<string, string>,
): { changes: Record<string, unknown>; errors: Record<string, string> } {
  const changes: Record<string, unknown> = {};
  const errors: Record<string, string> = {};
  for (const [key, text] of Object.entries(edited)) {
    if (!(key in original)) continue;
    const parsed = parseKnobInput(original[key], text);
    if (!parsed.ok) errors[key] = parsed.error;
    else if (!jsonEqual(parsed.value, original[key])) changes[key] = parsed.value;
  }
  return { changes, errors };
}

/** The knob an error message is about, so the editor can mark that field. */
export function knobNamedIn(error: string, keys: string[]): string | null {
  // Longest first: "training_args.learning_rate" before "learning_rate".
  const sorted = [...keys].sort((a, b) => b.length - a.length);
  for (const k of sorted) if (error.includes(k)) return k;
  for (const k of sorted) {
    const leaf = k.split(".").pop()!;
    if (new RegExp(`\\b${leaf.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\b`).test(error)) return k;
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// Formatting.

export function fmtNumber(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  if (Number.isInteger(v)) return String(v);
  return v.toPrecision(4).replace(/\.?0+$/, "");
}

export function fmtSeconds(s: number): string {
  if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  return `${(s / 60).toFixed(1)} min`;
}

/** "step 6/16": optimizer steps done. */
export function stepText(run: RunState): string {
  return run.totalSteps !== null ? `step ${run.completedSteps}/${run.totalSteps}` : `step ${run.completedSteps}`;
}

/** "epoch 1 · chunk 2/4": the last chunk trained, 1-based; before any, what the run waits for. */
export function chunkText(run: RunState): string {
  if (run.epoch === null || run.chunk === null) {
    if (run.status === "pending" || run.status === "running") {
      return run.warmStart && run.parent !== null ? `warm start from run ${run.parent} · first chunk next` : "first chunk next";
    }
    return "no chunk trained";
  }
  const chunk = run.numChunks !== null ? `chunk ${run.chunk + 1}/${run.numChunks}` : `chunk ${run.chunk + 1}`;
  return `epoch ${run.epoch + 1} · ${chunk}`;
}

/** "epoch 1 · chunk 2/4 · step 6/16". */
export function progressText(run: RunState): string {
  return `${chunkText(run)} · ${stepText(run)}`;
}

export function progressFraction(run: RunState): number {
  if (!run.totalSteps || run.totalSteps <= 0) return 0;
  return Math.max(0, Math.min(1, run.completedSteps / run.totalSteps));
}

// ---------------------------------------------------------------------------------------------
// Rungs: where the pruner stopped a run, marked on the eval chart at the run's last eval point.

export interface Rung {
  runId: number;
  x: number;
  y: number;
  color: string;
  /** Hover text: the run and the pruner's own reason, e.g. "pruned at chunk 2 (rank 5 of 8)". */
  text: string;
}

/**
 * One rung per pruned run that has a point of the chart's metric: the eval curve ends where the
 * run was cut, so its last finite point is the rung. Train charts get none (the pruner ranks
 * runs on eval metrics, and the train curve's last step is not where the decision was made).
 */
export function pruneRungs(state: PanelState, split: "train" | "eval", metric: string | null): Rung[] {
  if (split !== "eval" || metric === null) return [];
  const out: Rung[] = [];
  for (const run of [...state.runs.values()].sort((a, b) => a.id - b.id)) {
    if (!isPruned(run)) continue;
    const s = run.eval[metric];
    if (!s) continue;
    let i = s.x.length - 1;
    while (i >= 0 && (s.y[i] === null || !Number.isFinite(s.y[i] as number))) i--;
    if (i < 0) continue;
    out.push({
      runId: run.id, x: s.x[i], y: s.y[i] as number, color: runColor(run.id),
      text: `run ${run.id}: ${run.reason ?? "pruned"}`,
    });
  }
  return out;
}
