/**
 * Live generations side by side (./generations.ts is its model): a row per sample prompt, a
 * column per run shown, each cell what that run generated, at the point in training the slider
 * picks. The slider follows the newest point as chunks end, until the user moves it; moving it
 * back to the end follows again. Hidden until some run has generated.
 *
 * Every text (prompts, references, generations) comes from the user's data and model: it is set
 * as text nodes, never parsed as HTML.
 */
import { h } from "./dom";
import { emptyAnswer, exactMatch, genModel, visibleText, wordDiff, type GenModel } from "./generations";
import { runTitle } from "./names";
import { runColor, runKey } from "./palette";
import type { PanelState, RunState } from "./state";

export interface GenerationsView {
  details: HTMLDetailsElement;
  /** Redraw from `state` for the runs `shown` (what the table's filters show), `pinned` marked. */
  update(state: PanelState, shown: readonly RunState[], pinned: ReadonlySet<number>): void;
  dispose(): void;
}

/** How the view says "nothing yet" in a cell. */
export const NONE = "—";

/** How the view shows an answer with no text (a blank cell would look like a broken view). */
export const EMPTY = "(empty answer)";

/** The legend under the table when some prompt has a reference. */
export const LEGEND = ["✓ the answer equals the reference · ", "underlined", ": words the reference does not have"];

/** A generation's text in a cell, marked against the reference where there is one. */
export function genCell(text: string, reference: string | null): HTMLElement {
  const cell = h("div", { class: "rf-gen-text" });
  if (emptyAnswer(text)) {
    cell.classList.add("rf-gen-empty");
    cell.setAttribute("data-testid", "rf-gen-empty");
    cell.title = "the run generated no text, or only whitespace (for example, it produced the end-of-text token first)";
    cell.textContent = EMPTY;
    return cell;
  }
  const shown = visibleText(text);
  if (reference === null) {
    cell.textContent = shown;
    return cell;
  }
  if (exactMatch(text, reference)) {
    cell.classList.add("rf-gen-exact");
    cell.title = "the same as the reference (whitespace at the ends aside)";
    cell.append(h("span", { class: "rf-gen-mark", "data-testid": "rf-gen-exact", text: "✓ " }), shown);
    return cell;
  }
  cell.title = "underlined: words the reference does not have";
  for (const part of wordDiff(shown, visibleText(reference))) {
    cell.append(part.extra ? h("span", { class: "rf-gen-extra", text: part.text }) : part.text);
  }
  return cell;
}

export function createGenerationsView(opts: {
  /** A column header is hovered (null: none). */
  onHover: (runId: number | null) => void;
  /** A column header was clicked: pin or unpin the run. */
  onPick: (runId: number) => void;
}): GenerationsView {
  const summary = h("summary", { text: "generations" });
  const slider = h("input", { type: "range", class: "rf-gen-slider", min: "0", max: "0", step: "1", value: "0", "data-testid": "rf-generations-slider" });
  const label = h("span", { class: "rf-gen-label", "data-testid": "rf-generations-label" });
  const note = h("span", { class: "rf-knob-note", "data-testid": "rf-generations-note" });
  const bar = h("div", { class: "rf-curvebar" }, [h("label", {}, ["point in training ", slider]), label, note]);
  const wrap = h("div", { class: "rf-gen-wrap" });
  const legend = h("div", { class: "rf-gen-legend", "data-testid": "rf-generations-legend" },
    [LEGEND[0], h("span", { class: "rf-gen-extra", text: LEGEND[1] }), LEGEND[2]]);
  legend.style.display = "none";
  const details = h("details", { open: "", "data-testid": "rf-generations" }, [summary, bar, wrap, legend]);
  details.style.display = "none";
  /** The point the user picked (samples seen); null: follow the newest. */
  let chosen: number | null = null;
  let model: GenModel | null = null;
  let last: { state: PanelState; shown: readonly RunState[]; pinned: ReadonlySet<number> } | null = null;
  let drawKey = "";

  const redraw = () => {
    if (last) update(last.state, last.shown, last.pinned, true);
  };
  const onInput = () => {
    if (model === null || model.points.length === 0) return;
    const i = Math.max(0, Math.min(model.points.length - 1, slider.valueAsNumber));
    // The last point means "the newest": as more chunks end, the slider moves on with them.
    chosen = i === model.points.length - 1 ? null : model.points[i].x;
    redraw();
  };
  // Arrow keys step the slider by one point. The browser would do it, but inside JupyterLab the
  // notebook's command-mode shortcuts take the arrows (moving between cells) and cancel the
  // slider's own move; Home/End/PageUp/PageDown have no such binding and are left to the browser.
  const STEP: Record<string, number> = { ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1 };
  const onKey = (ev: KeyboardEvent) => {
    const step = STEP[ev.key];
    if (step === undefined || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    ev.preventDefault();
    ev.stopPropagation();
    if (slider.disabled || model === null || model.points.length === 0) return;
    const i = Math.max(0, Math.min(model.points.length - 1, slider.valueAsNumber + step));
    if (i === slider.valueAsNumber) return;
    slider.value = String(i);
    onInput();
  };
  slider.addEventListener("input", onInput);
  slider.addEventListener("keydown", onKey);
  details.addEventListener("toggle", redraw);

  function update(state: PanelState, shown: readonly RunState[], pinned: ReadonlySet<number>, force = false): void {
    last = { state, shown, pinned };
    if (state.generationCount === 0) {
      details.style.display = "none";
      return;
    }
    details.style.display = "";
    const key = `${state.generationCount}|${chosen}|${shown.map((r) => r.id).join(",")}|${[...pinned].join(",")}|${details.open}`;
    if (!force && key === drawKey) return;
    drawKey = key;
    const m = genModel(state, shown, chosen);
    model = m;
    const n = m.points.length;
    summary.textContent = `generations: ${m.prompts.length} prompt${m.prompts.length === 1 ? "" : "s"}, ` +
      `${m.columns.length} run${m.columns.length === 1 ? "" : "s"}${n > 0 ? `, ${m.label}` : ""}`;
    slider.max = String(Math.max(0, n - 1));
    slider.value = String(Math.max(0, m.index));
    slider.disabled = n <= 1;
    label.textContent = m.label + (chosen === null ? " · newest" : "");
    note.textContent = m.waiting.length
      ? `no generations yet: run${m.waiting.length === 1 ? "" : "s"} ${m.waiting.join(", ")}` : "";
    legend.style.display = m.references.some((r) => r !== null) ? "" : "none";
    if (!details.open) return;
    const x = m.index >= 0 ? m.points[m.index].x : null;
    const head = h("tr", {}, [h("th", { class: "rf-gen-prompt", text: "prompt" })]);
    for (const col of m.columns) {
      const key = runKey(col.runId);
      const glyph = h("span", { text: `${key.glyph} ` });
      glyph.style.color = runColor(col.runId);
      const th = h("th", { "data-run-id": String(col.runId), title: `${runTitle(state.runs.get(col.runId) ?? { id: col.runId, knobs: {} })}: hover to light up the run, click to pin it` },
        [glyph, col.name]);
      if (pinned.has(col.runId)) th.classList.add("rf-gen-pinned");
      // A run behind the others shows what it generated last: say from where.
      if (col.gen !== null && x !== null && col.gen.samples_seen !== x) {
        th.append(h("div", { class: "rf-gen-from", text: `from ${col.gen.samples_seen} samples` }));
      }
      head.append(th);
    }
    const rows = m.prompts.map((prompt, i) => {
      const ref = m.references[i] ?? null;
      const first = h("td", { class: "rf-gen-prompt" }, [h("div", { class: "rf-gen-text", text: prompt })]);
      if (ref !== null) first.append(h("div", { class: "rf-gen-ref" }, [h("span", { class: "rf-gen-ref-key", text: "reference: " }), ref]));
      const tr = h("tr", { "data-prompt-index": String(i) }, [first]);
      for (const col of m.columns) {
        const text = col.texts[i] ?? null;
        const td = h("td", { "data-run-id": String(col.runId) });
        if (text === null) {
          td.classList.add("rf-gen-none");
          td.textContent = NONE;
        } else {
          td.append(genCell(text, ref));
        }
        if (pinned.has(col.runId)) td.classList.add("rf-gen-pinned");
        tr.append(td);
      }
      return tr;
    });
    wrap.replaceChildren(h("table", { class: "rf-table rf-gen-table", "data-testid": "rf-generations-table" },
      [h("thead", {}, [head]), h("tbody", {}, rows)]));
  }

  const runOf = (ev: Event): number | null => {
    const th = (ev.target as Element | null)?.closest?.("th[data-run-id]");
    return th ? Number(th.getAttribute("data-run-id")) : null;
  };
  let hover: number | null = null;
  const onMove = (ev: Event) => {
    const id = runOf(ev);
    if (id !== hover) {
      hover = id;
      opts.onHover(id);
    }
  };
  const onLeave = () => {
    if (hover !== null) {
      hover = null;
      opts.onHover(null);
    }
  };
  const onClick = (ev: Event) => {
    const id = runOf(ev);
    if (id !== null) opts.onPick(id);
  };
  wrap.addEventListener("mouseover", onMove);
  wrap.addEventListener("mouseleave", onLeave);
  wrap.addEventListener("click", onClick);
  return {
    details,
    update: (s, shown, pinned) => update(s, shown, pinned),
    dispose: () => {
      slider.removeEventListener("input", onInput);
      slider.removeEventListener("keydown", onKey);
      wrap.removeEventListener("mouseover", onMove);
      wrap.removeEventListener("mouseleave", onLeave);
      wrap.removeEventListener("click", onClick);
      wrap.replaceChildren();
    },
  };
}
