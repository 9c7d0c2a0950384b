/**
 * Live generations side by side: what every run generated for the experiment's sample prompts
 * (`generation` events, one per run per chunk), at one point in training. No DOM (the view is
 * ./generationsview.ts), so vitest drives it.
 *
 * The points are the samples_seen values of every generation event (the same x as the eval
 * curves), sorted; at a point, each run shows its latest generation at or before it, so a run
 * that has not reached the point yet shows what it generated last rather than nothing.
 */
import { runName } from "./names";
import type { Generation, PanelState, RunState } from "./state";

export interface GenPoint {
  /** Samples seen. */
  x: number;
  /** Epoch and chunk (0-based, as logged) of the first generation logged at x. */
  epoch: number | null;
  chunk: number | null;
  /** Chunks an epoch of the run that logged it; null when unknown. */
  numChunks: number | null;
  /**
   * The run that logged it when that is a warm-started clone: x counts its parent's samples too,
   * but its epoch and chunk are its own, so the label names it (else the epochs of a list of
   * points sorted by x jump back and forth between the clones and the others); null otherwise.
   */
  cloneOf?: { run: number } | null;
}

/** The distinct points in training where some run generated, by samples seen. */
export function genPoints(state: PanelState): GenPoint[] {
  const byX = new Map<number, GenPoint>();
  for (const run of [...state.runs.values()].sort((a, b) => a.id - b.id)) {
    for (const g of run.generations) {
      if (g.samples_seen === null || byX.has(g.samples_seen)) continue;
      byX.set(g.samples_seen, {
        x: g.samples_seen, epoch: g.epoch, chunk: g.chunk, numChunks: run.numChunks,
        cloneOf: run.warmStart && run.parent !== null ? { run: run.id } : null,
      });
    }
  }
  return [...byX.values()].sort((a, b) => a.x - b.x);
}

/** A run's latest generation (in log order) with samples seen at or before `x`; null for none. */
export function genAt(run: Pick<RunState, "generations">, x: number): Generation | null {
  for (let i = run.generations.length - 1; i >= 0; i--) {
    const g = run.generations[i];
    if (g.samples_seen !== null && g.samples_seen <= x) return g;
  }
  return null;
}

/**
 * What `gen` answered to `prompts[i]`: its i-th text when it answered the same prompts, else its
 * text for that prompt wherever it asked it (a resumed experiment may ask other prompts); null
 * when it never asked it.
 */
export function textFor(gen: Generation, prompts: readonly string[], i: number): string | null {
  const prompt = prompts[i];
  const at = gen.prompts[i] === prompt ? i : gen.prompts.indexOf(prompt);
  return at >= 0 && at < gen.texts.length ? gen.texts[at] : null;
}

/**
 * "after 48 samples (chunk 2/4)"; the epoch is named only when training has more than one; a
 * warm clone's point says whose epoch it is ("after 39168 samples (run 5's epoch 27, chunk 1/4)").
 */
export function pointLabel(p: GenPoint, multiEpoch: boolean): string {
  const parts: string[] = [];
  if (multiEpoch && p.epoch !== null) parts.push(`epoch ${p.epoch + 1}`);
  if (p.chunk !== null) parts.push(`chunk ${p.chunk + 1}${p.numChunks !== null ? `/${p.numChunks}` : ""}`);
  const own = p.cloneOf && parts.length ? `run ${p.cloneOf.run}'s ` : "";
  return `after ${p.x} sample${p.x === 1 ? "" : "s"}${parts.length ? ` (${own}${parts.join(", ")})` : ""}`;
}

/**
 * A generation's text as a cell shows it. A tiny or undertrained model emits raw control bytes,
 * which browsers draw as nothing or as boxes that vary by font: each becomes U+FFFD, the mark a
 * decoder leaves for bytes it could not read, so the reader sees that something unreadable was
 * there. Line breaks and tabs are kept (a CRLF counts as one line break).
 */
export function visibleText(text: string): string {
  return text.replace(/\r\n/g, "\n").replace(/[^\P{Cc}\n\t]/gu, "\ufffd");
}

/** The run generated no text, or only whitespace (it ended its answer at once). */
export function emptyAnswer(text: string): boolean {
  return text.trim() === "";
}

/** The generation equals the reference, whitespace at either end aside. */
export function exactMatch(text: string, reference: string): boolean {
  return text.trim() === reference.trim();
}

/** A word as compared with the reference's: lower case, without punctuation at either end. */
export function normWord(word: string): string {
  return word.toLowerCase().replace(/^[\p{P}\p{S}]+|[\p{P}\p{S}]+$/gu, "");
}

export interface DiffPart {
  text: string;
  /**
   * A word the reference does not have. Whitespace and bare punctuation never are; unreadable
   * characters (U+FFFD, control characters) always are, unless the reference has the same token:
   * otherwise an answer of nothing but them would look like a match.
   */
  extra: boolean;
}

const UNREADABLE = /[\ufffd\p{Cc}]/u;

/**
 * The generation cut into words and the whitespace between them (joined, they give the text
 * back), each word marked when the reference has no such word: a word-level diff small enough
 * to read at a glance, not an alignment.
 */
export function wordDiff(text: string, reference: string): DiffPart[] {
  const tokens = reference.split(/\s+/).filter((t) => t !== "");
  const known = new Set(tokens.map(normWord).filter((w) => w !== ""));
  const literal = new Set(tokens);
  return text.split(/(\s+)/).filter((t) => t !== "").map((t) => {
    if (/^\s+$/.test(t)) return { text: t, extra: false };
    if (UNREADABLE.test(t)) return { text: t, extra: !literal.has(t) };
    const w = normWord(t);
    return { text: t, extra: w !== "" && !known.has(w) };
  });
}

export interface GenColumn {
  runId: number;
  name: string;
  /** The generation shown at the point; null: none yet. */
  gen: Generation | null;
  /** Its text per prompt of the model (null: none). */
  texts: (string | null)[];
}

export interface GenModel {
  points: GenPoint[];
  /** Index in `points` of the point shown; -1 when there is none. */
  index: number;
  label: string;
  prompts: string[];
  references: (string | null)[];
  columns: GenColumn[];
  /** Runs shown that have generated nothing yet (no column). */
  waiting: number[];
}

/**
 * What the view shows at point `at` (samples seen; null: the newest point): a column per run
 * in `shown` with at least one generation, ordered by id, and the prompts with their references.
 * A point between two logged ones shows the one before it.
 */
export function genModel(state: PanelState, shown: readonly RunState[], at: number | null): GenModel {
  const points = genPoints(state);
  let index = points.length - 1;
  if (at !== null) {
    while (index > 0 && points[index].x > at) index--;
  }
  const multiEpoch = [...state.runs.values()].some((r) => r.generations.some((g) => g.epoch !== null && g.epoch > 0));
  const x = index >= 0 ? points[index].x : null;
  const runs = [...shown].sort((a, b) => a.id - b.id);
  const columns: GenColumn[] = [];
  const waiting: number[] = [];
  for (const run of runs) {
    if (run.generations.length === 0) {
      waiting.push(run.id);
      continue;
    }
    columns.push({ runId: run.id, name: runName(run), gen: x === null ? null : genAt(run, x), texts: [] });
  }
  const prompts = state.samplePrompts?.prompts ?? [];
  for (const col of columns) col.texts = prompts.map((_, i) => (col.gen === null ? null : textFor(col.gen, prompts, i)));
  return {
    points, index, label: index >= 0 ? pointLabel(points[index], multiEpoch) : "",
    prompts, references: state.samplePrompts?.references ?? [], columns, waiting,
  };
}
