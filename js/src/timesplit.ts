/**
 * The engine time split under the table: where the engine's seconds went (train, eval, generate,
 * swap, other), for all runs and a bar per run, drawn as plain DOM on one seconds scale.
 */
import { timeSplitFigure } from "./chartplan";
import { h } from "./dom";
import { fmtSeconds } from "./format";
import { runColor, runKey } from "./palette";
import { TIME_COLORS, timeBars, timeSplitInterval } from "./scale";
import { finiteNumber, intOf, needsPull, type PanelState } from "./state";

export interface TimeSplitView {
  details: HTMLDetailsElement;
  /** Redraw from `state`, at most every timeSplitInterval; a later draw is asked for through
   * the factory's `requestDraw`. */
  render(state: PanelState): void;
  dispose(): void;
}

interface Use {
  peakMb: number | null;
  /**
   * On a CPU the engine reads the process's resident set, not what a run holds: the same figure
   * for every run. It is kept apart, for the all-runs row, and no run row claims it.
   */
  processMb: number | null;
  tokens: number;
  trainS: number;
}

/** A chunk trained on a CUDA device: its peak memory is the run's own (max allocated). */
function perRunMemory(device: unknown): boolean {
  return typeof device === "string" && device.startsWith("cuda");
}

/**
 * Per run (and all runs): the highest chunk peak memory where it is the run's own (CUDA), the
 * process's resident set where it is not (CPU), and tokens over train seconds.
 */
export function runResources(state: PanelState): { all: Use; runs: Map<number, Use> } {
  const all: Use = { peakMb: null, processMb: null, tokens: 0, trainS: 0 };
  const runs = new Map<number, Use>();
  for (const row of state.timeline) {
    const id = intOf(row.run_id);
    if (id === null) continue;
    let u = runs.get(id);
    if (!u) {
      u = { peakMb: null, processMb: null, tokens: 0, trainS: 0 };
      runs.set(id, u);
    }
    const mem = finiteNumber(row.peak_mem_mb);
    const tok = finiteNumber(row.tokens);
    const tr = finiteNumber(row.train_s);
    if (mem !== null) {
      if (perRunMemory(row.device)) for (const x of [u, all]) x.peakMb = Math.max(x.peakMb ?? 0, mem);
      else all.processMb = Math.max(all.processMb ?? 0, mem);
    }
    for (const x of [u, all]) {
      if (tok !== null && tr !== null && tr > 0) {
        x.tokens += tok;
        x.trainS += tr;
      }
    }
  }
  return { all, runs };
}

function fmtMb(mb: number): string {
  return mb >= 1024 ? `${(mb / 1024).toFixed(2)} GB` : `${mb.toFixed(0)} MB`;
}

/** "812 MB · 1.9k tok/s", or "process 620 MB · 1.9k tok/s" on a CPU (what is known of it). */
export function resourceWords(u: Use | undefined): string {
  if (!u) return "";
  const out: string[] = [];
  if (u.peakMb !== null) out.push(fmtMb(u.peakMb));
  else if (u.processMb !== null) out.push(`process ${fmtMb(u.processMb)}`);
  if (u.trainS > 0) {
    const tps = u.tokens / u.trainS;
    out.push(`${tps >= 1000 ? `${(tps / 1000).toFixed(1)}k` : tps.toFixed(0)} tok/s`);
  }
  return out.join(" · ");
}

/** What the figures of a row mean, for its tooltip. */
export function resourceTitle(u: Use | undefined, allRuns: boolean): string {
  const tokens = "tokens trained per second of train time";
  if (u?.peakMb != null) return `peak memory of its chunks (CUDA max allocated) · ${tokens}`;
  if (allRuns && u?.processMb != null) {
    return "the kernel process's peak resident memory while training on the CPU: there the runs share one process, " +
      `so no run's own memory is known and the run rows show none · ${tokens}`;
  }
  return allRuns ? tokens : `${tokens} (on a CPU no run's own memory is known: see the all-runs row)`;
}

export function createTimeSplitView(opts: {
  /** Ask the panel for a render of the split in a later frame. */
  requestDraw: () => void;
  /** Record a draw in the panel's update timings. */
  noteCall: (what: string) => void;
}): TimeSplitView {
  const summary = h("summary", { text: "engine time split" });
  const plot = h("div", { class: "rf-time-plot", "data-testid": "rf-time-split" });
  const details = h("details", { open: "" }, [summary, plot]);
  details.addEventListener("toggle", () => {
    if (details.open) opts.requestDraw();
  });
  let lastDraw = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const later = (ms: number) => {
    if (timer !== undefined) return;
    timer = setTimeout(() => {
      timer = undefined;
      opts.requestDraw();
    }, ms);
  };

  function render(state: PanelState): void {
    const now = Date.now();
    // Folded: nothing to draw until it opens. Times change with every chunk and a row per run is
    // rebuilt, so the interval grows with the runs shown (2 s up to 8 runs, 12 s at 48).
    const every = timeSplitInterval(state.runs.size);
    if (details.open && needsPull(state)) {
      // Still catching up on the log (a panel shown late): draw once caught up, rather than a
      // partial split that the cadence would then hold for `every`.
      later(500);
      return;
    }
    if (details.open && now - lastDraw < every) {
      later(every);
      return;
    }
    if (details.open) lastDraw = now;
    const fig = timeSplitFigure(state);
    if (fig.total <= 0) {
      summary.textContent = "engine time split (after the first chunk)";
      return;
    }
    const pct = (v: number) => `${((100 * v) / fig.total).toFixed(1)}%`;
    // Generating the sample prompts is optional: its slice is named only where some was spent.
    const shown = fig.categories.filter((c) => c !== "generate" || fig.values.generate[0] > 0);
    summary.textContent = `engine time ${fmtSeconds(fig.total)}: ${shown.map((c) => `${c} ${pct(fig.values[c][0])}`).join(" · ")}` +
      ` (overhead ${(fig.overhead * 100).toFixed(1)}%)`;
    if (!details.open) return;
    opts.noteCall("time:render");
    // Stacked bars on one seconds scale: a bar row per run is a handful of divs, and each run's
    // label carries its chart colour and dash glyph, so it reads with the same key.
    const legend = h("div", { class: "rf-time-legend" }, shown.map((c) => {
      const key = h("span", { class: "rf-time-key" });
      key.style.background = TIME_COLORS[c];
      return h("span", {}, [key, c]);
    }));
    // 22 px a row for a few runs; thinner rows (12 px at least) at 48 runs rather than a block a
    // screen tall.
    const rowPx = Math.max(12, Math.min(22, 500 / fig.rows.length));
    const res = runResources(state);
    const rows = timeBars(fig).map((bar) => {
      const use = bar.runId === null ? res.all : res.runs.get(bar.runId);
      const label = h("span", { class: "rf-time-label" });
      if (bar.runId !== null) {
        const glyph = h("span", { text: runKey(bar.runId).glyph });
        glyph.style.color = runColor(bar.runId);
        label.append(glyph, ` ${bar.label}`);
      } else {
        label.textContent = bar.label;
      }
      const fill = h("span", { class: "rf-time-fill" }, bar.segments.filter((g) => g.seconds > 0).map((g) => {
        const seg = h("span", { title: `${bar.label} ${g.category}: ${g.seconds.toFixed(2)} s` });
        seg.style.width = `${g.pct}%`;
        seg.style.background = TIME_COLORS[g.category];
        return seg;
      }));
      fill.style.width = `${bar.widthPct}%`;
      const row = h("div", {
        class: "rf-time-row",
        title: `${bar.label}: ${bar.segments.map((g) => `${g.category} ${g.seconds.toFixed(2)} s`).join(" · ")}`,
      }, [label, h("span", { class: "rf-time-track" }, [fill]), h("span", { class: "rf-time-total", text: fmtSeconds(bar.total) }),
        h("span", { class: "rf-time-res", "data-testid": "rf-time-res", text: resourceWords(use),
          title: resourceTitle(use, bar.runId === null) })]);
      row.style.height = `${rowPx}px`;
      row.style.fontSize = `${Math.min(11, rowPx - 2)}px`;
      return row;
    });
    plot.replaceChildren(legend, ...rows);
  }

  function dispose(): void {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    plot.replaceChildren();
  }
  return { details, render, dispose };
}
