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

/**
 * At most this many knobs in a name: five knobs and a module list read as a sentence nobody
 * scans in a legend or a hover. The id keeps names unique; `runTitle` has every knob.
 */
export const NAME_KNOBS = 2;
/** The knobs that set configs apart most often, first in a name; the others follow in logged order. */
export const NAME_PRIORITY = [
  "learning_rate", "r", "lora_alpha", "model_name", "per_device_train_batch_size",
  "gradient_accumulation_steps", "beta", "lr_scheduler_type", "weight_decay",
  "num_train_epochs", "max_steps", "warmup_ratio", "warmup_steps", "lora_dropout",
];
/** A value longer than this is cut, with an ellipsis. */
export const VALUE_CHARS = 12;

function cut(text: string, n: number): string {
  return text.length <= n ? text : `${text.slice(0, n - 1)}…`;
}

/** A knob value short enough for a name: a list as its first item and length (`q_proj…(4)`), a path as its last part. */
export function compactValueText(v: unknown): string {
  if (Array.isArray(v) && v.length > 1) {
    const text = knobValueText(v);
    return text.length > VALUE_CHARS ? `${cut(knobValueText(v[0]), VALUE_CHARS - 4)}…(${v.length})` : text;
  }
  let text = knobValueText(v);
  if (typeof v === "string" && text.replace(/\/+$/, "").includes("/")) text = text.replace(/\/+$/, "").split("/").pop() ?? text;
  return cut(text, VALUE_CHARS);
}

/** The knobs a name shows: the NAME_PRIORITY ones first, then the rest as logged; at most NAME_KNOBS. */
export function nameKeys(knobs: Record<string, unknown>): string[] {
  const keys = Object.keys(knobs);
  const rank = (k: string) => {
    const i = NAME_PRIORITY.indexOf(k.split(".").pop() ?? k);
    return i < 0 ? NAME_PRIORITY.length : i;
  };
  return keys.map((k, i) => [k, i] as const).sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).slice(0, NAME_KNOBS).map(([k]) => k);
}

/**
 * `3 · lr 1e-3 · r 32` (`run 3` without knobs): the run id, then at most two of its knobs
 * (`run_created.knobs`: the values its search group varies, plus what a clone changed), values
 * compact. Built from the run's own record, so a name never changes as other runs come and go.
 */
export function runName(run: Pick<RunState, "id" | "knobs">): string {
  const keys = nameKeys(run.knobs);
  // Nothing to tell it by: "run 3" reads better than a bare number.
  if (keys.length === 0) return `run ${run.id}`;
  return [String(run.id), ...keys.map((k) => `${knobWord(k)} ${compactValueText(run.knobs[k])}`)].join(" · ");
}

/** Every knob, values whole (hovers and titles): `3 · lr 1e-3 · r 32 · modules q_proj+v_proj`. */
export function runTitle(run: Pick<RunState, "id" | "knobs">): string {
  const keys = Object.keys(run.knobs);
  if (keys.length === 0) return `run ${run.id}`;
  return [String(run.id), ...keys.map((k) => `${knobWord(k)} ${knobValueText(run.knobs[k])}`)].join(" · ");
}
