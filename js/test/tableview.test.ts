// @vitest-environment happy-dom
// The run table as a view (./tableview.ts) in a DOM: what a row shows must survive the rows being
// rebuilt, which happens whenever the columns change (a clone adds the parent column, a new knob
// value adds a knob column, a deleted run takes one away).
import { describe, expect, it, vi } from "vitest";
import type { Client, Reply } from "../src/client";
import { applySnapshot, createState, ingest, type PanelState, type WireEvent } from "../src/state";
import { createRunTable, type Focus, type RunTable } from "../src/tableview";

interface Rig {
  state: PanelState;
  table: RunTable;
  focus: Focus;
  sent: Record<string, unknown>[];
  /** What the table said on the panel's message line. */
  said: string[];
  /** Answer the oldest request still waiting. */
  answer: (reply?: Partial<Reply>) => void;
  seq: { n: number };
}

function rig(): Rig {
  const state = createState();
  const sent: Record<string, unknown>[] = [];
  const said: string[] = [];
  const waiting: ((r: Reply) => void)[] = [];
  const client = {
    request: (content: Record<string, unknown>) => {
      sent.push(content);
      return new Promise<Reply>((resolve) => waiting.push(resolve));
    },
  } as unknown as Client;
  const focus: Focus = { hover: null, pinned: new Set(), hiddenRuns: new Set(), hide: { stopped: false, pruned: false, deleted: false } };
  const table = createRunTable({
    state, client, focus,
    metric: () => "eval_loss",
    disconnected: () => null,
    scheduleRender: () => {},
    emphasize: () => {},
    hiddenChanged: () => {},
    persistPrefs: () => {},
    say: (text: string) => { said.push(text); },
    requestPull: () => {},
    openClone: () => {},
    showTraceback: () => {},
  });
  document.body.replaceChildren(table.filterBox, table.wrap);
  const seq = { n: 0 };
  const events: WireEvent[] = [1, 2, 3].map((id) => ({
    seq: ++seq.n, type: "run_created", run_id: id, knobs: { lr: id * 1e-3 }, total_steps: 10, num_chunks: 2,
  }) as WireEvent);
  ingest(state, events);
  table.render();
  const answer = (reply: Partial<Reply> = {}) => waiting.shift()!({ type: "reply", request_id: "x", ok: true, ...reply } as Reply);
  return { state, table, focus, sent, said, answer, seq };
}

const row = (id: number) => document.querySelector<HTMLTableRowElement>(`tr[data-run-id="${id}"]`)!;
const button = (id: number, op: string) => row(id).querySelector<HTMLButtonElement>(`button[data-op="${op}"]`)!;

/** A clone of run 1: the first run with a parent adds the parent column, so every row is rebuilt. */
function cloneArrives(r: Rig): void {
  const before = row(2);
  ingest(r.state, [{ seq: ++r.seq.n, type: "run_created", run_id: 4, knobs: { lr: 9e-3 }, parent_run_id: 1, total_steps: 10 } as WireEvent]);
  r.table.render();
  expect(row(2)).not.toBe(before);   // the premise: the rows were rebuilt
}

describe("an armed Delete", () => {
  it("says it waits for a confirm, and says so when it lapses without deleting", () => {
    vi.useFakeTimers();
    try {
      const r = rig();
      button(2, "delete").click();
      expect(button(2, "delete").textContent).toBe("Confirm?");
      expect(r.said[r.said.length - 1]).toBe("delete run 2: click Confirm? within 4 s to delete it");
      vi.advanceTimersByTime(4100);
      expect(button(2, "delete").textContent).toBe("Delete");
      expect(r.said[r.said.length - 1]).toBe("delete run 2: not confirmed within 4 s, nothing deleted");
      expect(r.sent).toEqual([]);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("the run table across a rebuild of its rows", () => {
  it("a Delete waiting for its confirm still waits: one click after the rebuild does not delete", async () => {
    const r = rig();
    button(2, "delete").click();
    expect(button(2, "delete").textContent).toBe("Confirm?");
    cloneArrives(r);
    expect(button(2, "delete").textContent).toBe("Confirm?");
    await new Promise((ok) => setTimeout(ok, 450));   // past the double-click guard
    button(2, "delete").click();
    expect(r.sent).toEqual([{ type: "op", op: "delete", run_id: 2 }]);
  });

  it("an op in flight keeps its row's buttons disabled, and a second click sends nothing", () => {
    const r = rig();
    button(1, "stop").click();
    expect(r.sent).toHaveLength(1);
    cloneArrives(r);
    expect(button(1, "stop").disabled).toBe(true);
    button(1, "stop").click();
    expect(r.sent).toHaveLength(1);
  });

  it("a pinned row and a hidden swatch stay so", () => {
    const r = rig();
    row(3).querySelector("td:nth-child(2)")!.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    row(2).querySelector<HTMLElement>("[data-testid=rf-swatch]")!.click();
    expect(r.focus.pinned.has(3) && r.focus.hiddenRuns.has(2)).toBe(true);
    cloneArrives(r);
    expect(row(3).classList.contains("rf-pinned")).toBe(true);
    expect(row(2).querySelector("[data-testid=rf-swatch]")!.classList.contains("rf-swatch-off")).toBe(true);
  });
});

describe("a remembered sort by a knob column that is gone", () => {
  it("reads as the default, and the first click on the eval header reverses what is shown", () => {
    const r = rig();
    for (const [id, loss] of [[1, 2.0], [2, 1.0], [3, 3.0]]) {
      ingest(r.state, [{ seq: ++r.seq.n, type: "metric", run_id: id, split: "eval", step: 5, samples_seen: 40, metrics: { eval_loss: loss } } as WireEvent]);
    }
    r.table.restore({ column: "knob:gone", descending: true }, false);
    r.table.render();
    const evalHead = document.querySelector<HTMLElement>('th[data-sort="eval"]')!;
    expect(evalHead.dataset.sorted).toBe("asc");
    evalHead.click();
    r.table.render();
    expect(evalHead.dataset.sorted).toBe("desc");
    expect([...document.querySelectorAll<HTMLElement>("tbody tr[data-run-id]")].map((t) => t.dataset.runId)).toEqual(["3", "1", "2"]);
  });
});

describe("a panel over a folder opened read-only", () => {
  it("has every op button off, and a click sends nothing", () => {
    const r = rig();
    expect(button(1, "stop").disabled).toBe(false);   // the premise: a live panel's pending run can be stopped
    applySnapshot(r.state, { read_only: true });
    r.table.render();
    for (const id of [1, 2, 3]) {
      for (const op of ["stop", "resume", "delete", "clone"]) expect(button(id, op).disabled).toBe(true);
    }
    expect(button(2, "delete").title).toContain("opened read-only");
    button(1, "stop").click();
    expect(r.sent).toEqual([]);
  });
});
