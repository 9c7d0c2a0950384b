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

// ---------------------------------------------------------------------------------------------
// Dismissing a notice: hidden in this experiment's panel views (the log and the run table keep the
// loss), remembered per experiment like the view settings (viewprefs.ts): in localStorage when the
// front end allows it, and in this module's memory, which outlives one view within a page.

/** The small part of the Web Storage API used here (a test passes a Map-backed one). */
export interface NoticeStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

const DISMISS_PREFIX = "rapidfire-panel-dismissed:";
const memory = new Map<string, string>();

/** One key per experiment folder (the name alone when no path is known). */
export function dismissKey(path: string | null, name: string | null): string | null {
  const id = path || name;
  return id ? DISMISS_PREFIX + id : null;
}

/** A loss's identity: the worker and the time it was lost (a later session may reuse the name). */
export function noticeId(loss: WorkerLoss, index: number): string {
  return `${loss.worker}@${loss.time ?? `#${index}`}`;
}

function browserStore(): NoticeStore | null {
  try {
    const s = globalThis.localStorage;
    return s && typeof s.getItem === "function" ? s : null;
  } catch {
    return null; // access denied (sandboxed iframe, storage disabled)
  }
}

/** The dismissed notice ids; anything malformed in the store reads as none dismissed. */
export function loadDismissed(key: string | null, store: NoticeStore | null = browserStore()): Set<string> {
  if (key === null) return new Set();
  let raw: string | null = null;
  try {
    raw = store?.getItem(key) ?? null;
  } catch {
    raw = null;
  }
  raw ??= memory.get(key) ?? null;
  if (raw === null) return new Set();
  try {
    const data: unknown = JSON.parse(raw);
    return new Set(Array.isArray(data) ? data.filter((v): v is string => typeof v === "string" && v.length <= 200) : []);
  } catch {
    return new Set();
  }
}

export function saveDismissed(key: string | null, ids: Set<string>, store: NoticeStore | null = browserStore()): void {
  if (key === null) return;
  const text = JSON.stringify([...ids]);
  memory.set(key, text);
  try {
    store?.setItem(key, text);
  } catch {
    // quota or access denied: the in-page memory still has it
  }
}

/** The notices still shown: every loss not dismissed, in the order they happened. */
export function shownNotices(state: PanelState, dismissed: Set<string>): { id: string; text: string; title: string }[] {
  return state.lostWorkers
    .map((loss, i) => ({ id: noticeId(loss, i), text: workerLostNotice(loss), title: loss.reason ?? "" }))
    .filter((n) => !dismissed.has(n.id));
}

/** The notice block above the run table: one red line per lost worker, each with a × button. */
export function createWorkerNotices(): { el: HTMLDivElement; render(state: PanelState): void } {
  const el = document.createElement("div");
  el.className = "rf-worker-notices";
  el.dataset.testid = "rf-worker-lost";
  el.style.display = "none";
  let key: string | null = null;
  let dismissed = new Set<string>();
  let shownKey = "";
  let last: PanelState | null = null;

  function render(state: PanelState): void {
    last = state;
    const k = dismissKey(state.path, state.experiment);
    if (k !== key) {
      key = k;
      dismissed = loadDismissed(key);
    }
    const notices = shownNotices(state, dismissed);
    // this experiment's hidden ones: an accidental × must not lose a notice for good
    const hidden = state.lostWorkers.map((loss, i) => noticeId(loss, i)).filter((id) => dismissed.has(id));
    const now = `${notices.map((n) => n.id).join("\n")}|${hidden.length}`;
    if (now === shownKey) return;
    shownKey = now;
    const lines = notices.map((n) => {
      const close = document.createElement("button");
      close.className = "rf-notice-close";
      close.textContent = "×";
      close.title = "hide this notice in this experiment's panels (the event log, the timeline and %rapidfire status keep it)";
      close.setAttribute("aria-label", "dismiss");
      close.addEventListener("click", () => {
        dismissed.add(n.id);
        saveDismissed(key, dismissed);
        if (last) render(last);
      });
      const text = document.createElement("span");
      text.textContent = n.text;
      const line = document.createElement("div");
      line.className = "rf-error rf-notice";
      line.title = n.title;
      line.dataset.notice = n.id;
      line.append(text, close);
      return line;
    });
    if (hidden.length) {
      const show = document.createElement("button");
      show.className = "rf-notice-show";
      show.textContent = "show";
      show.title = "show the hidden worker notices again in this experiment's panels";
      show.addEventListener("click", () => {
        for (const id of hidden) dismissed.delete(id);
        saveDismissed(key, dismissed);
        if (last) render(last);
      });
      const note = document.createElement("div");
      note.className = "rf-note rf-notice-hidden";
      note.append(`${hidden.length} worker notice${hidden.length === 1 ? "" : "s"} hidden · `, show);
      lines.push(note);
    }
    el.replaceChildren(...lines);
    el.style.display = lines.length ? "" : "none";
  }
  return { el, render };
}
