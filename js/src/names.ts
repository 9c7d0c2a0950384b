/**
 * A run's short name: its id and the knobs that set it apart from the other runs,
 * `3 · lr 1e-3 · r 32`. The same rule as Python's (rapidfire_nb/tracking/naming.py), so the
 * panel, get_runs_info(), TensorBoard folders and the report call a run the same.
 */
import type { RunState } from "./state";

/** Short words for the knobs every search varies; any other knob goes by its last dotted part. */
export const KNOB_ABBREVIATIONS: Record<string, string> = {
  learning_rate: "lr", lora_alpha: "alpha", lora_dropout: "dropout", per_device_train_batch_size: "bs",
  gradient_accumulation_steps: "ga", weight_decay: "wd", warmup_ratio: "warmup", warmup_steps: "warmup",
  lr_scheduler_type: "sched", num_train_epochs: "epochs", max_length: "len", num_generations: "gens",
  target_modules: "modules", model_name: "model", max_steps: "steps",
};

/** The short word of a dotted knob key. */
export function knobWord(key: string): string {
  const last = key.split(".").pop() ?? key;
  return Object.prototype.hasOwnProperty.call(KNOB_ABBREVIATIONS, last) ? KNOB_ABBREVIATIONS[last] : last;
}

/** A knob value in a name: 1e-3, 0.05, 32, cosine, q_proj+v_proj. */
export function knobValueText(v: unknown): string {
  if (typeof v === "number") {
    if (!Number.isFinite(v)) return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-2 || a >= 1e6)) {
      const [m, e] = v.toExponential(2).split("e");
      return `${Number(m)}e${Number(e)}`;
    }
    return String(Number(v.toPrecision(3)));
  }
  if (Array.isArray(v)) return v.map(knobValueText).join("+");
  if (v === null || v === undefined) return "none";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** At most this many knobs in a name; more read "+2 knobs". */
export const NAME_KNOBS = 4;

/**
 * `3 · lr 1e-3 · r 32` (`run 3` without knobs): the run id, then its knobs as the log has them (`run_created.knobs`:
 * the values its search group varies, plus what a clone changed), in the logged order. Built
 * from the run's own record, so a name never changes as other runs come and go.
 */
export function runName(run: Pick<RunState, "id" | "knobs">): string {
  const keys = Object.keys(run.knobs);
  // Nothing to tell it by: "run 3" reads better than a bare number.
  if (keys.length === 0) return `run ${run.id}`;
  const parts = [String(run.id)];
  for (const k of keys.slice(0, NAME_KNOBS)) parts.push(`${knobWord(k)} ${knobValueText(run.knobs[k])}`);
  if (keys.length > NAME_KNOBS) parts.push(`+${keys.length - NAME_KNOBS} knobs`);
  return parts.join(" · ");
}
