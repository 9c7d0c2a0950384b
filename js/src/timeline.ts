/**
 * The chunk timeline: one lane per Ray worker (per device in the in-kernel engine), one block per
 * trained chunk from its start to its end, in the run's colour. The layout (lanes, blocks, the time
 * scale, the coalescing of blocks narrower than a few pixels) is pure and checked by vitest on the
 * recorded logs; `createTimelineView` draws it to one canvas, so 48 runs and hundreds of chunks
 * cost one element and a bounded number of rectangles, and nothing at all while folded.
 */
import { finiteNumber as finite, intOf, type PanelState, type TimelineRow } from "./state";
import { niceStep } from "./ticks";
import { runColor, runDash } from "./palette";
import { fmtSeconds } from "./format";

export interface LostSpan {
  /** Axis seconds (see TimelineModel.breaks) where the worker was lost. */
  from: number;
  /** Axis seconds where a later `workers` event listed that name again (a resumed session's new
   * worker, by log order, not by comparing clocks); null: lost to the end. */
  to: number | null;
  /** Seconds from the origin of the loss, for the text; null: its time is not logged. */
  at: number | null;
  reason: string | null;
}

export interface Lane {
  /** The worker name (w0, w1, ...), or the device in the in-kernel engine. */
  key: string;
  label: string;
  title: string;
  lost: LostSpan[];
}

export interface Block {
  lane: number;
  run: number;
  epoch: number | null;
  chunk: number | null;
  /** Axis seconds: seconds from the origin, less the idle gaps the axis skips (TimelineModel.breaks). */
  t0: number;
  t1: number;
  /** The run arrived on this worker with this chunk from another one (its checkpoint travelled there). */
  moved: boolean;
  /** The chunk in flight when its worker died: its start is not logged, t0 is a lower bound. */
  lost: boolean;
  title: string;
}

/** An idle stretch the axis leaves out (between two sessions of a resumed experiment, say). */
export interface AxisBreak {
  /** Axis seconds where the break is drawn; it takes BREAK_SHARE of the busy span there. */
  at: number;
  shown: number;
  /** Seconds from the origin where the idle stretch starts, and how long it is. */
  real: number;
  skipped: number;
}

export interface TimelineModel {
  /** Epoch seconds of the first chunk's start or loss (null before any). */
  origin: number | null;
  /** Axis seconds from the origin to the last chunk's end (or loss). */
  span: number;
  lanes: Lane[];
  blocks: Block[];
  /** Lanes are Ray workers (else devices of the in-kernel engine). */
  byWorker: boolean;
  /** chunk_done rows without a usable run id, start or end: counted, not drawn. */
  untimed: number;
  breaks: AxisBreak[];
}

/** Idle gaps longer than this many median chunks (and at least IDLE_MIN_S) are cut from the axis. */
export const IDLE_CHUNKS = 20;
export const IDLE_MIN_S = 60;
/** The width a cut gap keeps, as a share of the busy time shown. */
export const BREAK_SHARE = 0.03;


/**
 * "peak 812 MB · 1.9k tok/s": what the chunk used, when the engine logged it. Off CUDA the figure
 * is the process's resident set, shared by every run, and says so.
 */
export function resourceText(row: TimelineRow): string {
  const mem = finite(row.peak_mem_mb);
  const tps = finite(row.tokens_per_s);
  const out: string[] = [];
  const own = typeof row.device === "string" && row.device.startsWith("cuda");
  if (mem !== null) out.push(`${own ? "peak" : "process peak"} ${mem >= 1024 ? `${(mem / 1024).toFixed(2)} GB` : `${mem.toFixed(0)} MB`}`);
  if (tps !== null) out.push(`${tps >= 1000 ? `${(tps / 1000).toFixed(1)}k` : tps.toFixed(0)} tok/s`);
  return out.join(" · ");
}

function laneKey(row: TimelineRow): string {
  if (typeof row.worker === "string") return row.worker;
  return typeof row.device === "string" && row.device ? row.device : "device";
}

/** Durations on a timeline of seconds: two decimals below ten seconds. */
function dur(s: number): string {
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : s < 10 ? `${s.toFixed(2)} s` : fmtSeconds(s);
}

/** Long idle stretches in hours: "24.0 h". */
function idle(s: number): string {
  return s >= 7200 ? `${(s / 3600).toFixed(1)} h` : fmtSeconds(s);
}

function chunkWords(state: PanelState, run: number, epoch: number | null, chunk: number | null): string {
  if (epoch === null || chunk === null) return `run ${run}`;
  const n = state.runs.get(run)?.numChunks ?? null;
  return `run ${run} · epoch ${epoch + 1} · chunk ${chunk + 1}${n !== null ? `/${n}` : ""}`;
}

/** Last non-blank line of a Ray error, or null when there is none. */
export function reasonLine(reason: string | null): string | null {
  const lines = (reason ?? "").split("\n").map((l) => l.trim()).filter((l) => l);
  return lines.length ? lines[lines.length - 1] : null;
}

/** Lanes, blocks and the time origin from the folded state (state.timeline, workers, losses). */
export function timelineModel(state: PanelState): TimelineModel {
  const rows: { row: TimelineRow; run: number; start: number; end: number }[] = [];
  let untimed = 0;
  for (const row of state.timeline) {
    const run = intOf(row.run_id);
    const start = finite(row.start);
    const end = finite(row.end);
    if (run === null || start === null || end === null) {
      untimed++;
      continue;
    }
    rows.push({ row, run, start, end: Math.max(start, end) });
  }
  // A loop, not Math.min(...): a long experiment has more chunks than a call has arguments. A
  // worker lost in its constructor is lost before the first chunk: the origin is the earlier.
  let origin: number | null = null;
  for (const r of rows) if (origin === null || r.start < origin) origin = r.start;
  for (const l of state.lostWorkers) if (l.time !== null && (origin === null || l.time < origin)) origin = l.time;
  const byWorker = state.workers.length > 0 || rows.some((r) => typeof r.row.worker === "string");
  const lanes: Lane[] = [];
  const laneOf = new Map<string, number>();
  const lane = (key: string): number => {
    let i = laneOf.get(key);
    if (i === undefined) {
      i = lanes.length;
      laneOf.set(key, i);
      const info = state.workers.find((w) => w.worker === key);
      const where = [info?.device, info?.node ? `node ${info.node}` : null].filter(Boolean).join(", ");
      const worker = byWorker && (info !== undefined || rows.some((r) => r.row.worker === key));
      lanes.push({
        key, label: key, lost: [],
        title: worker ? `worker ${key}${where ? ` (${where})` : ""}` : `device ${key}`,
      });
    }
    return i;
  };
  for (const w of state.workers) lane(w.worker);
  if (origin === null) {
    // losses without times only: the lanes still say lost
    for (const loss of state.lostWorkers) {
      if (loss.until === null) lanes[lane(loss.worker)].lost.push({ from: 0, to: null, at: null, reason: loss.reason });
    }
    return { origin, span: 0, lanes, blocks: [], byWorker, untimed, breaks: [] };
  }

  // the chunk each loss lost: the re-trained one says so
  const relost = new Map<string, string>();
  for (const loss of state.lostWorkers) {
    const c = loss.chunk_lost;
    if (c !== null) relost.set(`${c.run_id}/${c.epoch}/${c.chunk}`, loss.worker);
  }
  const blocks: Block[] = [];
  const lastLane = new Map<number, number>();
  let span = 0;
  for (const { row, run, start, end } of rows) {
    const t0 = start - origin;
    const t1 = end - origin;
    span = Math.max(span, t1);
    const li = lane(laneKey(row));
    const epoch = intOf(row.epoch);
    const chunk = intOf(row.chunk);
    // the reducers already say false for a run's first chunk (the engine logs it moved)
    const moved = row.moved === true;
    const hop = finite(row.hop_s);
    const where = typeof row.worker === "string"
      ? `worker ${row.worker}${typeof row.device === "string" ? ` (${row.device})` : ""}`
      : `on ${lanes[li].key}`;
    const parts = [chunkWords(state, run, epoch, chunk), where,
      `${dur(t1 - t0)} (${t0.toFixed(2)}–${t1.toFixed(2)} s)`];
    const before = lastLane.get(run);
    lastLane.set(run, li);
    const gone = relost.get(`${run}/${epoch}/${chunk}`);
    if (gone !== undefined && gone !== lanes[li].key) {
      parts.push(`trained again here after ${gone} was lost (from its checkpoint)`);
    } else if (moved) {
      // the engine sends a run's checkpoint with the chunk that brings it to a worker
      parts.push(before === undefined || before === li ? "moved here from its checkpoint"
        : `moved here from ${lanes[before].key}`);
    } else if (before === undefined && typeof row.worker === "string") {
      parts.push("started here");
    }
    if (hop !== null) parts.push(`hop ${dur(hop)}: Ray round trip beyond the chunk`);
    const res = resourceText(row);
    if (res) parts.push(res);
    blocks.push({ lane: li, run, epoch, chunk, t0, t1, moved, lost: false, title: parts.join(" · ") });
  }

  const spans: { lane: number; span: LostSpan }[] = [];
  for (const loss of state.lostWorkers) {
    const li = lane(loss.worker);
    const at: number | null = loss.time === null ? null : loss.time - origin;
    const c = loss.chunk_lost;
    if (at !== null) {
      span = Math.max(span, at);
      // A worker trains one chunk at a time: its chunk in flight started after its last chunk
      // before the loss ended, and after the run's own previous chunk.
      let after = 0;
      for (const b of blocks) {
        if (b.t1 > at) continue;
        if (b.lane === li || (c !== null && b.run === c.run_id)) after = Math.max(after, b.t1);
      }
      if (c !== null) {
        const again = loss.workers_left === 0 ? "its run stopped at its last checkpoint" : "trained again on another worker";
        blocks.push({
          lane: li, run: c.run_id, epoch: c.epoch, chunk: c.chunk, t0: after, t1: at, moved: false, lost: true,
          title: `${chunkWords(state, c.run_id, c.epoch, c.chunk)} · lost with worker ${loss.worker} at ${at.toFixed(2)} s ` +
            `(started after ${after.toFixed(2)} s; a chunk is logged when it ends) · ${again}`,
        });
      }
    }
    // no time logged: lost after the lane's last chunk (the text says the time is unknown)
    let from = at;
    if (from === null) {
      from = 0;
      for (const b of blocks) if (b.lane === li && !b.lost) from = Math.max(from, b.t1);
    }
    const to = loss.until === null ? null : Math.max(from, loss.until - origin);
    const lostSpan: LostSpan = { from, to, at, reason: loss.reason };
    lanes[li].lost.push(lostSpan);
    spans.push({ lane: li, span: lostSpan });
  }

  // Cut long idle stretches (a resume a day later) from the axis, so each session stays readable.
  const marks: [number, number][] = blocks.map((b) => [b.t0, b.t1]);
  for (const { span: s } of spans) {
    marks.push([s.from, s.from]);
    if (s.to !== null) marks.push([s.to, s.to]);
  }
  marks.sort((a, b) => a[0] - b[0]);
  const durations = blocks.filter((b) => !b.lost).map((b) => b.t1 - b.t0).sort((a, b) => a - b);
  const median = durations.length ? durations[Math.floor(durations.length / 2)] : 1;
  const threshold = Math.max(IDLE_MIN_S, IDLE_CHUNKS * median);
  const gaps: [number, number][] = [];
  let covered = marks.length ? marks[0][0] : 0;
  for (const [a, b] of marks) {
    if (a - covered > threshold) gaps.push([covered, a]);
    covered = Math.max(covered, b);
  }
  const breaks: AxisBreak[] = [];
  if (gaps.length) {
    const busy = span - gaps.reduce((sum, [a, b]) => sum + (b - a), 0);
    const shown = Math.max(median, BREAK_SHARE * Math.max(busy, 1));
    let cut = 0;
    for (const [a, b] of gaps) {
      breaks.push({ at: a - cut, shown, real: a, skipped: b - a });
      cut += b - a - shown;
    }
    const axis = (t: number): number => {
      let out = t;
      for (const k of breaks) {
        if (t >= k.real + k.skipped) out -= k.skipped - k.shown;
        else if (t > k.real) return out - (t - k.real) + ((t - k.real) / k.skipped) * k.shown;
      }
      return out;
    };
    for (const b of blocks) {
      b.t0 = axis(b.t0);
      b.t1 = axis(b.t1);
    }
    for (const { span: s } of spans) {
      s.from = axis(s.from);
      if (s.to !== null) s.to = axis(s.to);
    }
    span = axis(span);
  }
  return { origin, span, lanes, blocks, byWorker, untimed, breaks };
}

/** The collapsed section's one-line summary. */
export function timelineSummary(model: TimelineModel): string {
  const chunks = model.blocks.filter((b) => !b.lost).length + model.untimed;
  const untimed = model.untimed ? ` (${model.untimed} without times, not drawn)` : "";
  const lost = model.lanes.filter((l) => l.lost.some((s) => s.to === null)).length;
  if (model.origin === null && !lost) return "chunk timeline (after the first chunk)";
  const of = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const skipped = model.breaks.reduce((sum, k) => sum + k.skipped - k.shown, 0);
  const length = `${fmtSeconds(model.span)}${skipped ? ` busy (${idle(skipped)} idle not drawn)` : ""}`;
  if (model.byWorker) {
    return `chunk timeline: ${of(chunks, "chunk")}${untimed} on ${of(model.lanes.length, "worker")}` +
      `${lost ? ` (${lost} lost)` : ""} · ${length}`;
  }
  const where = model.lanes.length === 1 ? model.lanes[0].label : of(model.lanes.length, "device");
  return `chunk timeline: ${of(chunks, "chunk")}${untimed} on ${where} · ${length}`;
}

/** The summary while folded: counts the state keeps, no pass over the chunks. */
export function foldedSummary(state: PanelState): string {
  const n = state.timeline.length;
  if (n === 0 && state.lostWorkers.length === 0) return "chunk timeline (after the first chunk)";
  const of = (k: number, word: string) => `${k} ${word}${k === 1 ? "" : "s"}`;
  if (state.workers.length === 0) return `chunk timeline: ${of(n, "chunk")}`;
  const lost = state.workers.filter((w) => w.lost).length;
  return `chunk timeline: ${of(n, "chunk")} on ${of(state.workers.length, "worker")}${lost ? ` (${lost} lost)` : ""}`;
}

// ---------------------------------------------------------------------------------------------
// Pixels.

export interface Geometry {
  width: number;
  height: number;
  /** Left margin for the lane labels. */
  gutter: number;
  top: number;
  laneH: number;
  /** Seconds shown: the span, at least one second (a first short chunk is not stretched). */
  seconds: number;
}

export const GUTTER_PX = 64;
export const AXIS_PX = 30;
/** Blocks narrower than this merge with their neighbours in the lane, up to MAX_GROUP_PX. */
export const MIN_BLOCK_PX = 3;
export const MAX_GROUP_PX = 6;

export function geometry(model: TimelineModel, width: number): Geometry {
  const lanes = Math.max(1, model.lanes.length);
  // 20 px lanes for a few workers, thinner (10 px at least) for many rather than a tall canvas.
  const laneH = Math.max(10, Math.min(20, Math.floor(240 / lanes)));
  const top = 4;
  return {
    width, gutter: GUTTER_PX, top, laneH,
    height: top + lanes * laneH + AXIS_PX,
    seconds: Math.max(1, model.span) * 1.02,
  };
}

export function xOf(g: Geometry, t: number): number {
  return g.gutter + (Math.max(0, t) / g.seconds) * Math.max(1, g.width - g.gutter - 8);
}

export interface Rect {
  lane: number;
  x: number;
  w: number;
  /** The run drawn (the one with the most time in a merged rectangle). */
  run: number;
  /** Indices into model.blocks. */
  blocks: number[];
  lost: boolean;
  title: string;
}

/**
 * One rectangle per block, except that neighbours in a lane narrower than MIN_BLOCK_PX merge into
 * one up to MAX_GROUP_PX wide (so a lane holds at most about width / 2 rectangles whatever the number of
 * chunks); a merged rectangle takes the colour of the run with the most time in it and its title
 * lists the runs. Lost chunks always stand alone.
 */
export function layoutRects(model: TimelineModel, g: Geometry): Rect[] {
  const rects: Rect[] = [];
  const byLane = new Map<number, number[]>();
  model.blocks.forEach((b, i) => {
    const list = byLane.get(b.lane) ?? [];
    list.push(i);
    byLane.set(b.lane, list);
  });
  for (const [laneIdx, ids] of byLane) {
    ids.sort((a, b) => model.blocks[a].t0 - model.blocks[b].t0);
    let group: number[] = [];
    let gx0 = 0;
    let gx1 = 0;
    const flush = () => {
      if (!group.length) return;
      rects.push(merged(model, laneIdx, group, gx0, Math.max(gx1 - gx0, 1)));
      group = [];
    };
    for (const i of ids) {
      const b = model.blocks[i];
      const x0 = xOf(g, b.t0);
      const x1 = xOf(g, b.t1);
      if (b.lost || x1 - x0 >= MIN_BLOCK_PX) {
        flush();
        rects.push({
          lane: laneIdx, x: x0, w: Math.max(x1 - x0, b.lost ? MIN_BLOCK_PX : 1), run: b.run, blocks: [i],
          lost: b.lost, title: b.title,
        });
        continue;
      }
      // join the group while it stays thin and the block follows within a pixel
      if (group.length && (x0 - gx1 > 1 || x1 - gx0 > MAX_GROUP_PX)) flush();
      if (!group.length) gx0 = x0;
      group.push(i);
      gx1 = Math.max(gx1, x1);
    }
    flush();
  }
  return rects;
}

function merged(model: TimelineModel, lane: number, ids: number[], x: number, w: number): Rect {
  const first = model.blocks[ids[0]];
  if (ids.length === 1) return { lane, x, w, run: first.run, blocks: ids, lost: false, title: first.title };
  const time = new Map<number, number>();
  let t0 = Infinity;
  let t1 = -Infinity;
  for (const i of ids) {
    const b = model.blocks[i];
    time.set(b.run, (time.get(b.run) ?? 0) + (b.t1 - b.t0));
    t0 = Math.min(t0, b.t0);
    t1 = Math.max(t1, b.t1);
  }
  const runs = [...time.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]);
  const names = runs.slice(0, 8).map(([r]) => r).join(", ") + (runs.length > 8 ? ", …" : "");
  return {
    lane, x, w, run: runs[0][0], blocks: ids, lost: false,
    title: `${ids.length} short chunks (${t0.toFixed(2)}–${t1.toFixed(2)} s) of run${runs.length > 1 ? "s" : ""} ${names}; ` +
      "widen the panel (or zoom the page out) for single chunks",
  };
}

/** The rectangle under a point (canvas pixels), or null; within 2 px of a thin one counts. */
export function hitTest(rects: Rect[], g: Geometry, x: number, y: number): Rect | null {
  const lane = Math.floor((y - g.top) / g.laneH);
  let best: Rect | null = null;
  let bestD = 2.5;
  for (const r of rects) {
    if (r.lane !== lane) continue;
    const d = x < r.x ? r.x - x : x > r.x + r.w ? x - r.x - r.w : 0;
    if (d < bestD || (d === 0 && best !== null && r.lost)) {
      best = r;
      bestD = d;
    }
  }
  return best;
}

/**
 * Hover text off the blocks: a lane's label names the worker (or device); the hatched part of a
 * lost worker's lane says when and why it was lost.
 */
export function laneHover(model: TimelineModel, g: Geometry, x: number, y: number): string | null {
  const i = Math.floor((y - g.top) / g.laneH);
  const lane = model.lanes[i];
  if (!lane || y < g.top) return null;
  const lostText = (s: LostSpan) => {
    const why = reasonLine(s.reason);
    const when = s.at !== null ? (s.at < 0.005 && s.from === 0 ? "before its first chunk" : `at ${s.at.toFixed(2)} s`)
      : "(its time is not logged)";
    return `worker ${lane.key} lost ${when}` +
      `${s.to !== null ? ` (a later session listed a new ${lane.key}; it is live again)` : ""}${why ? `: ${why}` : ""}`;
  };
  if (x < g.gutter) return [lane.title, ...lane.lost.map(lostText)].join("; ");
  for (const s of lane.lost) {
    if (x >= xOf(g, s.from) && (s.to === null || x <= xOf(g, s.to))) return lostText(s);
  }
  return null;
}

/** Hover text over an axis break: how long the idle stretch the axis leaves out is. */
export function breakHover(model: TimelineModel, g: Geometry, x: number): string | null {
  for (const k of model.breaks) {
    if (x >= xOf(g, k.at) - 2 && x <= xOf(g, k.at + k.shown) + 2) {
      return `no chunk for ${idle(k.skipped)} (from ${k.real.toFixed(2)} s; a later session, say): the axis leaves it out`;
    }
  }
  return null;
}

/** Axis ticks: round times in s, min or h within each stretch between breaks, as axis seconds with labels. */
export function axisTicks(model: TimelineModel, g: Geometry): { t: number; label: string }[] {
  const total = g.seconds;
  const unit = total >= 7200 ? 3600 : total >= 600 ? 60 : 1;
  const name = unit === 3600 ? "h" : unit === 60 ? "min" : "s";
  const perPx = total / Math.max(1, g.width - g.gutter - 8);
  // stretches between breaks: [axis start, axis end, real minus axis]
  const parts: [number, number, number][] = [];
  let a = 0;
  let shift = 0;
  for (const k of model.breaks) {
    parts.push([a, k.at, shift]);
    a = k.at + k.shown;
    shift = k.real + k.skipped - a;
  }
  parts.push([a, total, shift]);
  const out: { t: number; label: string }[] = [];
  for (const [from, to, off] of parts) {
    const count = Math.max(1, Math.floor((to - from) / perPx / 80));
    const raw = (to - from) / unit / count;
    if (!(raw > 0)) continue;
    const step = niceStep(raw, 1) * unit;
    for (let i = Math.ceil((from + off) / step - 1e-9); i * step <= to + off + 1e-9; i++) {
      const real = i * step;
      out.push({ t: real - off, label: `${Number((real / unit).toPrecision(12))} ${name}` });
    }
  }
  return out;
}

/** Minimum ms between redraws while open: a canvas redraw is cheap, but the layout is O(chunks). */
export function timelineInterval(runs: number): number {
  return Math.max(1000, Math.min(5000, 100 * runs));
}

// ---------------------------------------------------------------------------------------------
// The view: a folded <details> with one canvas.

export interface TimelineView {
  details: HTMLDetailsElement;
  /** New events were applied: redraw now or at the next slot of the cadence (open only). */
  update(state: PanelState): void;
  dispose(): void;
}

/** What the browser test reads off the element (data-testid="rf-timeline"). */
export interface TimelineInspection {
  lanes: { key: string; label: string; title: string; lost: LostSpan[] }[];
  blocks: { lane: string; run: number; epoch: number | null; chunk: number | null; t0: number; t1: number;
    moved: boolean; lost: boolean; title: string }[];
  rects: { lane: string; x: number; y: number; w: number; h: number; run: number; blocks: number; lost: boolean }[];
  draws: number;
}

export function createTimelineView(): TimelineView {
  const summary = document.createElement("summary");
  summary.textContent = "chunk timeline (after the first chunk)";
  const canvas = document.createElement("canvas");
  canvas.className = "rf-timeline-canvas";
  const tip = document.createElement("div");
  tip.className = "rf-timeline-tip";
  tip.style.display = "none";
  const wrap = document.createElement("div");
  wrap.className = "rf-timeline";
  wrap.dataset.testid = "rf-timeline";
  wrap.append(canvas, tip);
  const details = document.createElement("details");
  details.append(summary, wrap);

  let state: PanelState | null = null;
  let lastDraw = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let userToggled = false;
  let autoOpening = false;
  let drawn: { model: TimelineModel; rects: Rect[]; g: Geometry } | null = null;
  const inspection: TimelineInspection = { lanes: [], blocks: [], rects: [], draws: 0 };
  (wrap as unknown as { rfTimeline: TimelineInspection }).rfTimeline = inspection;

  function update(s: PanelState): void {
    state = s;
    // Ray experiments open it once, when the workers appear, unless the user folded it already.
    if (!details.open && !userToggled && s.workers.length > 0) {
      autoOpening = true;
      details.open = true;
    }
    if (!details.open) {
      summary.textContent = foldedSummary(s);
      return;
    }
    const every = timelineInterval(s.runs.size);
    const wait = lastDraw + every - Date.now();
    if (wait > 0) {
      timer ??= setTimeout(() => {
        timer = undefined;
        if (state) update(state);
      }, wait);
      return;
    }
    draw();
  }

  let drawnKey = "";
  function draw(force = false): void {
    if (!state || !details.open) return;
    const width = wrap.clientWidth;
    if (width <= 0) return; // not laid out yet: the resize observer calls back
    // every pull reply reaches update(); with no new chunk, loss or worker the picture is the same
    const key = [width, state.timeline.length, state.lostWorkers.length, state.workers.length,
      state.workers.filter((w) => w.lost).length, state.runs.size].join("/");
    if (!force && key === drawnKey) return;
    drawnKey = key;
    lastDraw = Date.now();
    const model = timelineModel(state);
    summary.textContent = timelineSummary(model);
    const g = geometry(model, width);
    const rects = layoutRects(model, g);
    drawn = { model, rects, g };
    paint(canvas, model, g, rects);
    inspection.lanes = model.lanes.map((l) => ({ key: l.key, label: l.label, title: l.title, lost: l.lost }));
    inspection.blocks = model.blocks.map((b) => ({
      lane: model.lanes[b.lane].key, run: b.run, epoch: b.epoch, chunk: b.chunk, t0: b.t0, t1: b.t1,
      moved: b.moved, lost: b.lost, title: b.title,
    }));
    inspection.rects = rects.map((r) => ({
      lane: model.lanes[r.lane].key, x: r.x, y: g.top + r.lane * g.laneH, w: r.w, h: g.laneH, run: r.run,
      blocks: r.blocks.length, lost: r.lost,
    }));
    inspection.draws++;
  }

  details.addEventListener("toggle", () => {
    if (autoOpening) autoOpening = false;
    else userToggled = true;
    if (details.open) {
      lastDraw = 0;
      draw(true);
    }
  });
  canvas.addEventListener("mousemove", (e) => {
    if (!drawn) return;
    const box = canvas.getBoundingClientRect();
    const x = e.clientX - box.left;
    const y = e.clientY - box.top;
    const text = hitTest(drawn.rects, drawn.g, x, y)?.title ?? laneHover(drawn.model, drawn.g, x, y)
      ?? (y >= drawn.g.top ? breakHover(drawn.model, drawn.g, x) : null);
    if (text === null) {
      tip.style.display = "none";
      return;
    }
    tip.textContent = text;
    tip.style.display = "";
    const left = Math.min(e.clientX - box.left + 12, Math.max(0, drawn.g.width - tip.offsetWidth - 4));
    tip.style.left = `${left}px`;
    tip.style.top = `${e.clientY - box.top + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => {
    tip.style.display = "none";
  });
  let lastWidth = 0;
  const resize = typeof ResizeObserver === "function"
    ? new ResizeObserver(() => {
        if (wrap.clientWidth !== lastWidth && details.open) {
          lastWidth = wrap.clientWidth;
          draw(true);
        }
      })
    : null;
  resize?.observe(wrap);

  return {
    details,
    update,
    dispose() {
      if (timer !== undefined) clearTimeout(timer);
      resize?.disconnect();
    },
  };
}

function cssVar(el: Element, name: string, fallback: string): string {
  return getComputedStyle(el).getPropertyValue(name).trim() || fallback;
}

function paint(canvas: HTMLCanvasElement, model: TimelineModel, g: Geometry, rects: Rect[]): void {
  const dpr = window.devicePixelRatio || 1;
  canvas.style.width = `${g.width}px`;
  canvas.style.height = `${g.height}px`;
  canvas.width = Math.round(g.width * dpr);
  canvas.height = Math.round(g.height * dpr);
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, g.width, g.height);
  const fg = cssVar(canvas, "--rf-fg", "#1f2328");
  const fg2 = cssVar(canvas, "--rf-fg2", "#59636e");
  const grid = cssVar(canvas, "--rf-border", "#d0d7de");
  const error = cssVar(canvas, "--rf-error", "#c62828");
  const bottom = g.top + model.lanes.length * g.laneH;
  const right = xOf(g, g.seconds);
  const ticks = axisTicks(model, g);
  ctx.strokeStyle = grid;
  ctx.lineWidth = 1;
  for (const { t } of ticks) {
    const x = Math.round(xOf(g, t)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(x, g.top);
    ctx.lineTo(x, bottom + 3);
    ctx.stroke();
  }
  ctx.font = `${Math.min(11, g.laneH - 2)}px sans-serif`;
  ctx.textBaseline = "middle";
  // lanes: label, separator, and the lost part hatched from the loss on
  for (const [i, lane] of model.lanes.entries()) {
    const y = g.top + i * g.laneH;
    const lost = lane.lost.some((s) => s.to === null);
    ctx.fillStyle = lost ? error : fg2;
    ctx.fillText(lost ? `${lane.label} lost` : lane.label, 4, y + g.laneH / 2, g.gutter - 8);
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(g.gutter, y + g.laneH - 0.5);
    ctx.lineTo(right, y + g.laneH - 0.5);
    ctx.stroke();
    for (const s of lane.lost) {
      const x0 = xOf(g, s.from);
      const x1 = s.to === null ? right : xOf(g, s.to);
      ctx.save();
      ctx.beginPath();
      ctx.rect(x0, y + 1, Math.max(1, x1 - x0), g.laneH - 2);
      ctx.clip();
      ctx.strokeStyle = error;
      ctx.globalAlpha = 0.35;
      for (let hx = x0 - g.laneH; hx < x1; hx += 6) {
        ctx.beginPath();
        ctx.moveTo(hx, y + g.laneH);
        ctx.lineTo(hx + g.laneH, y);
        ctx.stroke();
      }
      ctx.restore();
      ctx.strokeStyle = error;
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.moveTo(x0, y);
      ctx.lineTo(x0, y + g.laneH);
      ctx.stroke();
    }
  }
  // chunks: the run's colour; runs past the palette (same colour) are drawn lighter with an edge
  for (const r of rects) {
    const y = g.top + r.lane * g.laneH + 2;
    const h = g.laneH - 4;
    const color = runColor(r.run);
    ctx.globalAlpha = r.lost ? 0.3 : runDash(r.run) === "solid" ? 1 : 0.45;
    ctx.fillStyle = color;
    ctx.fillRect(r.x, y, r.w, h);
    ctx.globalAlpha = 1;
    if (r.lost) {
      ctx.strokeStyle = error;
      ctx.lineWidth = 1.5;
      ctx.setLineDash([3, 2]);
      ctx.strokeRect(r.x + 0.75, y + 0.75, Math.max(0, r.w - 1.5), h - 1.5);
      ctx.setLineDash([]);
    } else if (runDash(r.run) !== "solid") {
      ctx.strokeStyle = color;
      ctx.lineWidth = 1;
      ctx.strokeRect(r.x + 0.5, y + 0.5, Math.max(0, r.w - 1), h - 1);
    } else if (r.w >= 3) {
      // a thin edge in the text colour: a palette colour close to the page background stays visible
      ctx.strokeStyle = fg2;
      ctx.globalAlpha = 0.6;
      ctx.lineWidth = 1;
      ctx.strokeRect(r.x + 0.5, y + 0.5, Math.max(0, r.w - 1), h - 1);
      ctx.globalAlpha = 1;
    }
    // a moved run: a dark notch at the start of the chunk that brought it here
    if (r.blocks.length === 1 && model.blocks[r.blocks[0]].moved && r.w >= 4) {
      ctx.fillStyle = fg;
      ctx.fillRect(r.x, y, 2, h);
    }
  }
  // time axis labels
  ctx.fillStyle = fg2;
  ctx.font = "10px sans-serif";
  ctx.textBaseline = "top";
  ctx.textAlign = "center";
  for (const { t, label } of ticks) ctx.fillText(label, xOf(g, t), bottom + 4);
  // a cut idle stretch: two slashes across the lanes and how long it was
  for (const k of model.breaks) {
    const x0 = xOf(g, k.at);
    const x1 = Math.max(x0 + 4, xOf(g, k.at + k.shown));
    ctx.clearRect(x0, g.top, x1 - x0, bottom - g.top);
    ctx.strokeStyle = fg2;
    ctx.lineWidth = 1;
    for (const x of [x0, x1]) {
      ctx.beginPath();
      ctx.moveTo(x - 2, bottom + 2);
      ctx.lineTo(x + 2, g.top - 2);
      ctx.stroke();
    }
    ctx.fillText(`+${idle(k.skipped)}`, (x0 + x1) / 2, bottom + 16);
  }
  ctx.textAlign = "right";
  ctx.fillText(model.breaks.length ? "time from the first chunk (idle stretches cut)" : "seconds from the first chunk",
    right, bottom + 16);
  ctx.textAlign = "left";
}
