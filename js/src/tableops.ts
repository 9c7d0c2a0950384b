/**
 * The run table's ops: a button click sends its op to the kernel and reports the reply; one op
 * per row at a time; Delete asks for a second click on the same button instead of a modal.
 */
import type { Client } from "./client";
import { noteQueued, type PanelState } from "./state";
import type { Row, SimpleOp } from "./tablerow";

const OP_WORDS: Record<SimpleOp, string> = {
  stop: "stop", resume: "resume", delete: "delete",
  confirm_suggestion: "confirm the pruner's stop of", ignore_suggestion: "ignore the pruner's suggestion for",
};
/** A click with no reply after this long says so (the kernel answers between cells only). */
const OP_SLOW_MS = 4000;
/** A confirming second click on Delete sooner than this is one double click, not a confirmation. */
const DELETE_CONFIRM_MIN_MS = 400;

export interface RowOpsContext {
  state: PanelState;
  client: Client;
  /** Why the panel is disconnected, or null while it is live. */
  disconnected: () => string | null;
  scheduleRender: (what: { charts?: boolean; table?: boolean; header?: boolean }) => void;
  say: (text: string, kind?: "ok" | "error" | "note") => void;
  requestPull: () => void;
}

export interface RowOps {
  simpleOp(row: Row, runId: number, op: SimpleOp): Promise<void>;
  deleteClicked(row: Row, runId: number): void;
  /** An op of this run waits for its reply. */
  busy(runId: number): boolean;
  /** This run's Delete waits for its confirming click. */
  armed(runId: number): boolean;
  /** Some Delete waits for its confirming click (rows hold their places meanwhile). */
  anyArmed(): boolean;
  dispose(): void;
}

/**
 * `rowOf` finds a run's current row: a change of columns rebuilds every row, so the state of an
 * op (busy, armed) is kept here by run id, not in the row.
 */
export function createRowOps(ctx: RowOpsContext, rowOf: (runId: number) => Row | undefined): RowOps {
  const { state } = ctx;
  const busyRuns = new Set<number>();
  const deleteArmed = new Map<number, { at: number; timer: ReturnType<typeof setTimeout> }>();

  async function simpleOp(row: Row, runId: number, op: SimpleOp): Promise<void> {
    const words = OP_WORDS[op];
    if (ctx.disconnected() !== null) {
      ctx.say(`${words} run ${runId}: not sent, ${ctx.disconnected()}`, "error");
      return;
    }
    // A second click (a double click, or Stop then Resume before the first reply) would reach
    // the kernel before the next render disables the buttons: one op per row at a time.
    if (busyRuns.has(runId)) return;
    busyRuns.add(runId);
    setRowButtonsBusy(row);
    ctx.scheduleRender({ table: true });
    ctx.say(`${words} run ${runId}…`);
    // The kernel answers a click only between cells: past a few seconds, say why it waits.
    const slow = setTimeout(() => {
      if (busyRuns.has(runId) && ctx.disconnected() === null) {
        ctx.say(`${words} run ${runId}: no reply from the kernel after ${OP_SLOW_MS / 1000} s; a cell is `
          + "probably running (clicks act once it finishes)", "error");
      }
    }, OP_SLOW_MS);
    const reply = await ctx.client.request({ type: "op", op, run_id: runId });
    clearTimeout(slow);
    busyRuns.delete(runId);
    if (ctx.disconnected() !== null) ctx.say(`${words} run ${runId}: not delivered, ${ctx.disconnected()}`, "error");
    // Only a run training now waits for a boundary; the engine applies the rest on its next turn.
    else if (reply.ok) ctx.say(`${words} run ${runId}: accepted${(op === "stop" || op === "resume" || op === "delete") && state.runs.get(runId)?.status === "running" ? " (applies at its next chunk boundary)" : ""}`, "ok");
    else ctx.say(`${words} run ${runId}: ${reply.error}`, "error");
    if ("queued" in reply) noteQueued(state, reply.queued);
    ctx.scheduleRender({ table: true, header: true });
    if (ctx.disconnected() === null) ctx.requestPull();
  }

  function deleteClicked(row: Row, runId: number): void {
    // Two clicks instead of a modal confirm(), which blocks the whole notebook page.
    const armed = deleteArmed.get(runId);
    if (armed === undefined) {
      // The confirm belongs to this run's own button, and rows hold their places while it is
      // armed, so the second click lands on the same run.
      row.buttons.delete.textContent = "Confirm?";
      row.buttons.delete.title = `click again within 4 s to delete run ${runId}`;
      ctx.say(`delete run ${runId}: click Confirm? within 4 s to delete it`);
      deleteArmed.set(runId, {
        at: performance.now(),
        timer: setTimeout(() => {
          deleteArmed.delete(runId);
          const now = rowOf(runId) ?? row;
          now.buttons.delete.textContent = "Delete";
          now.buttons.delete.title = `Delete run ${runId}`;
          ctx.say(`delete run ${runId}: not confirmed within 4 s, nothing deleted`);
          ctx.scheduleRender({ table: true });
        }, 4000),
      });
      return;
    }
    // A double click is not a confirmation: the second click must come a moment later.
    if (performance.now() - armed.at < DELETE_CONFIRM_MIN_MS) return;
    clearTimeout(armed.timer);
    deleteArmed.delete(runId);
    row.buttons.delete.textContent = "Delete";
    row.buttons.delete.title = `Delete run ${runId}`;
    void simpleOp(row, runId, "delete");
  }

  return {
    simpleOp,
    deleteClicked,
    busy: (runId) => busyRuns.has(runId),
    armed: (runId) => deleteArmed.has(runId),
    anyArmed: () => deleteArmed.size > 0,
    dispose: () => {
      for (const a of deleteArmed.values()) clearTimeout(a.timer);
    },
  };
}

/** Disable the row's op buttons now, not at the next frame (the render keeps them so). */
function setRowButtonsBusy(row: Row): void {
  row.buttons.stop.disabled = true;
  row.buttons.resume.disabled = true;
  row.buttons.delete.disabled = true;
  row.answers.confirm_suggestion.disabled = true;
  row.answers.ignore_suggestion.disabled = true;
}
