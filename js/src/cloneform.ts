/**
 * The clone form's validation and submit logic, apart from the DOM so vitest can drive it.
 *
 * Validation is debounced and asynchronous; a newer check supersedes an older one. The submit
 * path must never depend on which check is newest: a click that lands while a debounced check is
 * in flight used to see its own check "superseded" and return without creating or saying why
 * (review_panel.md finding 1). So submit() invalidates every check in flight, validates and
 * creates with its own request, and always ends with an outcome the form shows.
 */
import type { Reply } from "./client";

export interface ClonePayload {
  changes: Record<string, unknown>;
  warm_start: boolean;
}

export type CheckOutcome =
  | { kind: "parse-error" }
  | { kind: "stale" }
  | { kind: "valid" }
  | { kind: "refused"; error: string };

export type SubmitOutcome =
  | { kind: "parse-error" }
  | { kind: "refused"; error: string }
  | { kind: "created"; newRunId: unknown }
  | { kind: "closed" };

export interface CloneFormHooks {
  /** Current form contents; ok is false while a field does not parse. */
  collect(): { changes: Record<string, unknown>; ok: boolean; warm_start: boolean };
  /** Send the clone op (validate_only or not) and resolve with Python's reply. */
  send(payload: ClonePayload, validateOnly: boolean): Promise<Reply>;
  /** False once the form was closed or replaced. */
  isOpen(): boolean;
}

export class CloneSubmitter {
  private serial = 0;
  private submitting = false;

  constructor(private readonly hooks: CloneFormHooks) {}

  /** True while a click's create is in flight: a late check must not repaint the form then. */
  get busy(): boolean {
    return this.submitting;
  }

  /** A validation for the status line; "stale" when a newer check or a submit superseded it. */
  async check(): Promise<CheckOutcome> {
    const mine = ++this.serial;
    const { changes, ok, warm_start } = this.hooks.collect();
    if (!ok) return { kind: "parse-error" };
    const reply = await this.hooks.send({ changes, warm_start }, true);
    if (mine !== this.serial || this.submitting || !this.hooks.isOpen()) return { kind: "stale" };
    return reply.ok ? { kind: "valid" } : { kind: "refused", error: reply.error ?? "refused" };
  }

  /**
   * The click: create the clone from what the form holds now, or say why not. Checks in flight
   * are superseded (their replies are dropped), never the other way round.
   */
  async submit(): Promise<SubmitOutcome> {
    this.serial++;
    this.submitting = true;
    try {
      const { changes, ok, warm_start } = this.hooks.collect();
      if (!ok) return { kind: "parse-error" };
      // Python validates again before it creates anything (validate_only=false builds the same
      // configs first), so one request both checks and creates.
      const reply = await this.hooks.send({ changes, warm_start }, false);
      if (!this.hooks.isOpen()) return { kind: "closed" };
      if (!reply.ok) return { kind: "refused", error: reply.error ?? "refused" };
      return { kind: "created", newRunId: reply.new_run_id };
    } finally {
      this.serial++;
      this.submitting = false;
    }
  }
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

function jsonEqual(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** The knobs whose parsed value differs from the original: the clone's `changes`. */
export function knobChanges(
  original: Record<string, unknown>,
  edited: Record<string, string>,
): { changes: Record<string, unknown>; errors: Record<string, string> } {
  // Prototype-free: a knob may be named "__proto__" or "constructor".
  const changes: Record<string, unknown> = Object.create(null);
  const errors: Record<string, string> = Object.create(null);
  for (const [key, text] of Object.entries(edited)) {
    if (!Object.prototype.hasOwnProperty.call(original, key)) continue;
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
