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
