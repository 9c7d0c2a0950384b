/**
 * Ray workers (Experiment(num_workers=...)) in the panel: which worker trained each run's last
 * chunk, and what to say when a worker was lost. Pure functions of the folded state (state.ts),
 * so vitest checks them on the recorded ray_workers fixture.
 */
import type { PanelState, RunState, WorkerLoss } from "./state";

/** The run table shows a worker column only for an experiment trained on Ray workers. */
export function hasWorkers(state: PanelState): boolean {
  if (state.workers.length > 0) return true;
  for (const r of state.runs.values()) if (r.worker !== null) return true;
  return false;
}

/** The worker cell: the worker that trained the run's last chunk, "–" before its first chunk. */
export function workerCell(state: PanelState, run: RunState): { text: string; title: string } {
  if (run.worker === null) return { text: "–", title: "no chunk trained yet" };
  const info = state.workers.find((w) => w.worker === run.worker);
  const where = [info?.device, info?.node ? `node ${info.node}` : null].filter(Boolean).join(", ");
  const lost = info?.lost ? " (since lost)" : "";
  return {
    text: run.worker,
    title: `last chunk trained on worker ${run.worker}${where ? ` (${where})` : ""}${lost}`,
  };
}

function runList(ids: number[]): string {
  return ids.length === 1 ? `run ${ids[0]}` : `runs ${ids.join(", ")}`;
}

/** One line per lost worker, in the order they were lost. */
export function workerLostNotice(loss: WorkerLoss): string {
  const head = `worker ${loss.worker} lost${loss.node ? ` (node ${loss.node})` : ""}`;
  const parts: string[] = [];
  if (loss.workers_left === 0) {
    // The engine stops every active run when no worker is left; resume starts new workers.
    const one = loss.runs.length === 1;
    parts.push(loss.runs.length
      ? `no worker left: ${runList(loss.runs)} stopped at ${one ? "its last checkpoint; resume it" : "their last checkpoints; resume them"} to start new workers`
      : "no worker left; resume the stopped runs to start new workers");
  } else if (loss.runs.length) {
    const rest = loss.runs.length === 1 ? "continues from its last checkpoint" : "continue from their last checkpoints";
    parts.push(`${runList(loss.runs)} ${rest} on the other workers`);
  }
  if (loss.chunk_lost && loss.workers_left !== 0) {
    const c = loss.chunk_lost;
    parts.push(`run ${c.run_id}'s chunk ${c.chunk + 1} (epoch ${c.epoch + 1}) is trained again`);
  }
  return parts.length ? `${head}: ${parts.join("; ")}` : head;
}

export function workerLostNotices(state: PanelState): { text: string; title: string }[] {
  return state.lostWorkers.map((loss) => ({ text: workerLostNotice(loss), title: loss.reason ?? "" }));
}
