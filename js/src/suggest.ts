/**
 * Suggest mode (`pruner_mode="suggest"`): the pruner marks runs it would stop with a
 * `pruning_suggested` event, and the user answers each one from its row (Confirm / Ignore), which
 * Python logs as a `confirm_suggestion` / `ignore_suggestion` op. The state keeps the open
 * question per run (`RunState.suggestion`); this file says when the view asks it.
 */
import type { PanelState, RunState } from "./state";

/** A run's suggestion needs an answer while the run can still be stopped. */
export function suggestionOpen(run: RunState): boolean {
  return run.suggestion !== null && (run.status === "pending" || run.status === "running");
}

/** Ids of the runs whose suggestion waits for an answer, ascending. */
export function suggestedRuns(state: PanelState): number[] {
  return [...state.runs.values()].filter(suggestionOpen).map((r) => r.id).sort((a, b) => a - b);
}
