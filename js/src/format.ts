/**
 * Text the panel shows for numbers, seconds, knobs, metrics and a run's progress. Pure functions
 * of the folded state (./state.ts), so vitest checks the wording the browser tests read.
 */
import type { RunState } from "./state";

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

/**
 * The run's own progress: optimizer steps from 0 to its total. A warm-started clone's engine
 * counters start at its parent's data position (`baseStep`); that is where its data starts, told
 * apart (`dataStartText`), not steps it trained.
 */
export function ownSteps(run: RunState): { done: number; total: number | null } {
  const done = Math.max(0, run.completedSteps - run.baseStep);
  const total = run.totalSteps !== null ? Math.max(0, run.totalSteps - run.baseStep) : null;
  return { done, total };
}

/**
 * Why a warm clone's steps differ from get_runs_info(): there, completed_steps and total_steps
 * are positions in the data stream, which starts at the parent's step; empty for other runs.
 */
export function stepTitle(run: RunState): string {
  if (run.baseStep <= 0) return "";
  const total = run.totalSteps !== null ? ` of total_steps ${run.totalSteps}` : "";
  return `the clone's own steps; get_runs_info() counts positions in the data stream, which for a `
    + `warm clone start at its parent's step ${run.baseStep}: completed_steps ${run.completedSteps}${total}`;
}

/** "step 6/16": the run's own optimizer steps. */
export function stepText(run: RunState): string {
  const { done, total } = ownSteps(run);
  return total !== null ? `step ${done}/${total}` : `step ${done}`;
}

/** The run's own epoch (1-based) of its last trained step, and its number of epochs, when known. */
export function ownEpoch(run: RunState): { epoch: number; epochs: number } | null {
  const { done, total } = ownSteps(run);
  if (run.stepsPerEpoch === null || total === null || total <= 0) return null;
  const epochs = Math.max(1, Math.ceil(total / run.stepsPerEpoch));
  const epoch = Math.min(epochs, Math.max(1, Math.ceil(done / run.stepsPerEpoch)));
  return { epoch, epochs };
}

/**
 * "data from chunk 3/4 (where run 1 was)": where a warm-started clone's data begins. The log's
 * `base_chunk` is that chunk already (0-based): the chunk after the parent's last completed one.
 */
export function dataStartText(run: RunState): string {
  if (!run.warmStart || run.parent === null) return "";
  const n = run.numChunks;
  const start = run.baseChunk ?? 0;
  return `data from chunk ${start + 1}${n !== null ? `/${n}` : ""} (where run ${run.parent} was)`;
}

/**
 * "epoch 1/3 · chunk 2/4": the run's own epoch and the chunk of data it trained last, 1-based;
 * before any, what the run waits for.
 */
export function chunkText(run: RunState): string {
  if (run.epoch === null || run.chunk === null) {
    if (run.status === "pending" || run.status === "running") {
      return run.warmStart && run.parent !== null ? `warm start from run ${run.parent} · first chunk next` : "first chunk next";
    }
    return "no chunk trained";
  }
  const chunk = run.numChunks !== null ? `chunk ${run.chunk + 1}/${run.numChunks}` : `chunk ${run.chunk + 1}`;
  const own = ownEpoch(run);
  // Without the run's plan (an older log), the engine's epoch of the data stream.
  const epoch = own !== null ? `epoch ${own.epoch}/${own.epochs}` : `epoch ${run.epoch + 1}`;
  return `${epoch} · ${chunk}`;
}

/** "epoch 1/3 · chunk 2/4 · step 6/16". */
export function progressText(run: RunState): string {
  return `${chunkText(run)} · ${stepText(run)}`;
}

export function progressFraction(run: RunState): number {
  const { done, total } = ownSteps(run);
  if (!total || total <= 0) return 0;
  return Math.max(0, Math.min(1, done / total));
}

export function formatKnobValue(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "number") return String(value);
  return JSON.stringify(value);
}

/**
 * A knob's value in a table cell: a list of names (target_modules) as "q_proj, v_proj", long
 * ones cut to their first three and a count ("q_proj, k_proj, v_proj +4"), not clipped JSON;
 * the cell's title has the whole value.
 */
export function knobCellText(value: unknown): string {
  if (Array.isArray(value) && value.every((v) => typeof v === "string" || typeof v === "number")) {
    const items = value.map(String);
    return items.length > 3 ? `${items.slice(0, 3).join(", ")} +${items.length - 3}` : items.join(", ");
  }
  return formatKnobValue(value);
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
  return Object.prototype.hasOwnProperty.call(LABELS, leaf) ? LABELS[leaf] : leaf.replace(/_/g, " ");
}

/** A metric name as a column header: "eval_loss" -> "eval loss" (the raw name stays in the title). */
export function readableMetric(metric: string): string {
  return metric.replace(/[_.]+/g, " ").trim() || metric;
}
