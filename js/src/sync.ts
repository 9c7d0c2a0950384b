/**
 * How the view keeps up with the kernel: the pushed events, the pulls ("events since seq N") that
 * back them up, the snapshot the widget model carries, and the comm closing. Everything that
 * arrives is folded into the state (./state.ts) and turned into a request for a redraw.
 */
import type { AnyModel } from "@anywidget/types";
import type { Client, Reply } from "./client";
import type { Parts } from "./frames";
import type { Session } from "./session";
import { applySnapshot, ingest, needsPull, noteKnownSeq, noteOnDevice, noteQueued } from "./state";

export type Model = AnyModel<{ snapshot: Record<string, unknown> }>;

const PULL_INTERVAL_MS = 1000;
/**
 * Pull anyway when no push arrived for this long (Colab drops background-thread pushes). A pull
 * is also how the view learns that the kernel went away (its send fails), so this bounds how long
 * a panel whose kernel restarted can still look live: about two seconds.
 */
const PUSH_SILENCE_MS = 1000;

export interface SyncContext {
  model: Model;
  client: Client;
  session: Session;
  scheduleRender: (what: Partial<Parts>) => void;
  /** `applied` events arrived at `start` and are folded in now (the update timings). */
  noteIngest: (start: number, applied: number) => void;
  /** The experiment may have just become known: bring back what was set up for it. */
  restorePrefs: () => void;
  /** A pull was answered. */
  answered: () => void;
  /** A pull was refused or timed out (the kernel is busy, or gone). */
  waiting: (why: string | undefined) => void;
  /** The kernel closed the widget or went away. */
  disconnect: (why: string) => void;
}

/** ipywidgets' model also says when its comm closes; anywidget's types do not name that event. */
type CommEvents = { on(name: string, cb: () => void): void; off(name: string, cb: () => void): void };

export class Sync {
  private timer: ReturnType<typeof setInterval> | undefined = undefined;
  private lastPushAt = 0;
  private pullAgain = false;
  private readonly onCustom = (msg: unknown): void => this.dispatch(msg);
  private readonly onSnapshot = (): void => this.snapshotChanged();
  private readonly onClosed = (): void =>
    this.ctx.disconnect("the kernel closed this panel's connection (kernel restarted or shut down)");

  constructor(private readonly ctx: SyncContext) {
    ctx.model.on("msg:custom", this.onCustom);
    ctx.model.on("change:snapshot", this.onSnapshot);
    (ctx.model as unknown as CommEvents).on("comm:close", this.onClosed);
  }

  /** Pull what the snapshot left out, then keep pulling while pushes stay away. */
  start(): void {
    this.requestPull();
    this.timer = setInterval(() => {
      const now = Date.now();
      if (needsPull(this.ctx.session.state) || now - this.lastPushAt > PUSH_SILENCE_MS) this.requestPull();
    }, PULL_INTERVAL_MS);
  }

  /** Stop the pull timer (the kernel is gone: nothing can be sent). */
  stop(): void {
    clearInterval(this.timer);
  }

  dispose(): void {
    clearInterval(this.timer);
    this.ctx.model.off("msg:custom", this.onCustom);
    this.ctx.model.off("change:snapshot", this.onSnapshot);
    (this.ctx.model as unknown as CommEvents).off("comm:close", this.onClosed);
  }

  readonly requestPull = (): void => {
    const { client, session } = this.ctx;
    const now = Date.now();
    if (!client.canPull(now)) {
      this.pullAgain = true;
      return;
    }
    this.pullAgain = false;
    void client.pull(session.state.lastSeq, now).then((reply: Reply) => {
      if (session.disposed || session.disconnected !== null) return;
      const state = session.state;
      if (reply.ok) {
        if ("on_device" in reply && noteOnDevice(state, reply.on_device)) this.ctx.scheduleRender({ header: true, table: true });
        if ("queued" in reply && noteQueued(state, reply.queued)) this.ctx.scheduleRender({ header: true, table: true });
        this.absorb(reply.events, reply.last_seq);
        this.ctx.answered();
        // Batches are capped in size: keep pulling until caught up.
        if (reply.more === true || needsPull(state) || this.pullAgain) this.requestPull();
      } else {
        this.ctx.waiting(reply.error ?? undefined);
      }
    });
  };

  private absorb(events: unknown, lastSeq: unknown): void {
    const state = this.ctx.session.state;
    const t0 = performance.now();
    noteKnownSeq(state, lastSeq);
    const r = ingest(state, events);
    this.ctx.restorePrefs();
    this.ctx.noteIngest(t0, r.applied);
    this.ctx.scheduleRender({
      header: true,
      charts: r.applied > 0,
      table: r.changedRuns.size > 0 || r.newMetrics,
      time: r.timeChanged,
    });
  }

  private dispatch(msg: unknown): void {
    const { session, client } = this.ctx;
    if (session.disposed || !msg || typeof msg !== "object") return;
    const data = msg as Record<string, unknown>;
    if (data.type === "events") {
      this.lastPushAt = Date.now();
      if ("queued" in data && noteQueued(session.state, data.queued)) this.ctx.scheduleRender({ table: true });
      this.absorb(data.events, data.last_seq);
      if (needsPull(session.state)) this.requestPull();
    } else if (data.type === "reply") {
      client.handleReply(data as unknown as Reply);
      // Another view's pull reply carries events too; applying them is idempotent.
      if (Array.isArray(data.events)) this.absorb(data.events, data.last_seq);
    }
  }

  private snapshotChanged(): void {
    const state = this.ctx.session.state;
    const before = state.onDevice;
    const queuedBefore = state.queued;
    applySnapshot(state, this.ctx.model.get("snapshot"));
    // The badges name the run on the device and queued ops: either change repaints the rows.
    this.ctx.scheduleRender({ header: true, table: state.onDevice !== before || state.queued !== queuedBefore });
    if (needsPull(state)) this.requestPull();
  }
}
