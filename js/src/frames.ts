/**
 * Rendering coalesced into one animation frame: whatever asked for a redraw since the last frame
 * (header, charts, table, time split) is drawn once, in one pass. Also keeps each update's cost,
 * which the browser test reads off the panel element.
 */

/** The parts of the panel a frame redraws. */
export interface Parts {
  charts: boolean;
  table: boolean;
  time: boolean;
  header: boolean;
}

/** One update's cost in the browser, as the browser test reads it from the panel element. */
export interface UpdateTiming {
  events: number;
  runs: number;
  /** ingest (state) + render (DOM and canvas) work, excluding the wait for an animation frame. */
  workMs: number;
  ingestMs: number;
  renderMs: number;
  /** From the message's arrival to the charts being drawn, the frame wait included. */
  wallMs: number;
  /** What this update changed in the charts ("train:extend", "eval:emphasis", "train:draw", ...). */
  calls: string[];
}

const NOTHING: Parts = { charts: false, table: false, time: false, header: false };
const MAX_TIMINGS = 500;

export class FrameScheduler {
  /** The last updates' costs, oldest first. */
  readonly timings: UpdateTiming[] = [];
  private pending: Parts = { ...NOTHING };
  private scheduled = false;
  /** What the frame being rendered changed in the charts, for the update timings. */
  private callLog: string[] = [];
  /** The events ingested since the last frame: when they arrived and what folding them cost. */
  private update: { start: number; ingestMs: number; events: number } | null = null;

  constructor(private readonly opts: {
    draw: (what: Parts) => void;
    onError: (err: unknown) => void;
    isDisposed: () => boolean;
    /** How many runs the state holds (recorded with each update's cost). */
    runs: () => number;
  }) {}

  /** Record a chart change of the frame being drawn ("train:extend", ...). */
  readonly noteCall = (what: string): void => {
    this.callLog.push(what);
  };

  /** `applied` events arrived at `start` and took until now to fold into the state. */
  noteIngest(start: number, applied: number): void {
    if (applied <= 0) return;
    if (this.update === null) this.update = { start, ingestMs: 0, events: 0 };
    this.update.ingestMs += performance.now() - start;
    this.update.events += applied;
  }

  schedule(what: Partial<Parts>): void {
    const p = this.pending;
    this.pending = {
      charts: p.charts || !!what.charts,
      table: p.table || !!what.table,
      time: p.time || !!what.time,
      header: p.header || !!what.header,
    };
    if (this.scheduled || this.opts.isDisposed()) return;
    this.scheduled = true;
    const run = () => this.frame();
    // Background tabs throttle requestAnimationFrame to nothing; a timeout keeps state current.
    if (typeof requestAnimationFrame === "function" && document.visibilityState === "visible") {
      requestAnimationFrame(run);
    } else {
      setTimeout(run, 50);
    }
  }

  private frame(): void {
    this.scheduled = false;
    if (this.opts.isDisposed()) return;
    const what = this.pending;
    this.pending = { ...NOTHING };
    const renderStart = performance.now();
    const frameCalls: string[] = [];
    this.callLog = frameCalls;
    try {
      this.opts.draw(what);
    } catch (err) {
      this.opts.onError(err);
    }
    if (this.update !== null) {
      // The canvas draws synchronously: when render returns, the charts are drawn.
      const u = this.update;
      this.update = null;
      const end = performance.now();
      this.record({
        events: u.events, runs: this.opts.runs(), ingestMs: u.ingestMs, renderMs: end - renderStart,
        workMs: u.ingestMs + (end - renderStart), wallMs: end - u.start, calls: frameCalls,
      });
    }
  }

  private record(t: UpdateTiming): void {
    const timings = this.timings;
    timings.push(t);
    if (timings.length > MAX_TIMINGS) timings.splice(0, timings.length - MAX_TIMINGS);
  }
}
