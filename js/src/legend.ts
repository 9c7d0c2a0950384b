/**
 * The colour key under the charts, and the box a click on a key entry opens: the run's note,
 * saved into the experiment's log.
 */
import { traceName } from "./chartplan";
import type { Client } from "./client";
import { h } from "./dom";
import type { MessageKind } from "./messages";
import { runTitle } from "./names";
import { runColor } from "./palette";
import type { Session } from "./session";

export interface LegendContext {
  session: Session;
  client: Client;
  say: (text: string, kind?: MessageKind) => void;
  requestPull: () => void;
  /** The pointer entered a key entry (the run's id) or left it (null). */
  onHover: (runId: number | null) => void;
}

export class Legend {
  readonly el = h("div", { class: "rf-legend", "data-testid": "rf-legend" });
  private readonly noteInput = h("input", { type: "text", maxlength: "2000", "data-testid": "rf-note-input", placeholder: "a note on this run (empty clears it)" });
  private readonly noteSave = h("button", { text: "Save note", "data-testid": "rf-note-save" });
  private readonly noteLabel = h("span", { class: "rf-note-label" });
  readonly noteBox: HTMLDivElement;
  private key = "";
  /** The run whose note the box edits. */
  private noteRun: number | null = null;

  constructor(private readonly ctx: LegendContext) {
    const { noteInput, noteSave } = this;
    const noteClose = h("button", { text: "Close", "data-role": "close" });
    this.noteBox = h("div", { class: "rf-notebox", "data-testid": "rf-notebox" }, [this.noteLabel, noteInput, noteSave, noteClose]);
    this.noteBox.style.display = "none";
    noteSave.addEventListener("click", () => void this.saveNote());
    noteInput.addEventListener("keydown", (ev) => {
      ev.stopPropagation();   // the notebook's shortcuts stay out of the field
      if (ev.key === "Enter") void this.saveNote();
      if (ev.key === "Escape") this.noteBox.style.display = "none";
    });
    noteClose.addEventListener("click", () => {
      this.noteBox.style.display = "none";
      this.noteRun = null;
    });
  }

  /**
   * One entry per run with a curve, in its colour and dash, by its short name. Hovering an entry
   * emphasizes the run as hovering its row does; runs hidden by their swatch in the table are
   * struck through.
   */
  render(): void {
    const { state, focus } = this.ctx.session;
    const runs = [...state.runs.values()]
      .filter((r) => Object.keys(r.train).length > 0 || Object.keys(r.eval).length > 0)
      .sort((a, b) => a.id - b.id);
    const entries = runs.map((r) => [r.id, traceName(r), focus.hiddenRuns.has(r.id), r.note, runTitle(r)] as const);
    const key = JSON.stringify(entries);
    if (key === this.key) return;
    this.key = key;
    this.el.replaceChildren(...entries.map(([id, name, hidden, note, full]) => {
      const swatch = h("span", { class: "rf-legend-swatch" });
      swatch.style.background = runColor(id);
      const item = h("span", { class: `rf-legend-item${hidden ? " rf-legend-hidden" : ""}`, "data-run": String(id),
        "data-testid": "rf-legend-item",
        title: `${full}: hover to emphasize its curves, click to write a note on it${hidden ? " (hidden by its swatch in the table)" : ""}${note ? `\nnote: ${note}` : ""}` },
      [swatch, name, ...(note ? [h("span", { class: "rf-legend-note", text: " ✎", title: note })] : [])]);
      item.addEventListener("mouseenter", () => {
        focus.hover = id;
        this.ctx.onHover(id);
      });
      item.addEventListener("mouseleave", () => {
        if (focus.hover === id) focus.hover = null;
        this.ctx.onHover(null);
      });
      item.addEventListener("click", () => this.openNote(id));
      return item;
    }));
  }

  private openNote(id: number): void {
    const run = this.ctx.session.state.runs.get(id);
    if (!run) return;
    this.noteRun = id;
    this.noteLabel.textContent = `note on ${traceName(run)}: `;
    this.noteInput.value = run.note ?? "";
    this.noteBox.style.display = "";
    this.noteInput.focus();
  }

  private async saveNote(): Promise<void> {
    const { session, client, say } = this.ctx;
    if (this.noteRun === null || session.disconnected !== null) return;
    const id = this.noteRun;
    this.noteSave.disabled = true;
    const reply = await client.request({ type: "note", run_id: id, text: this.noteInput.value });
    this.noteSave.disabled = session.disconnected !== null;
    if (reply.ok) {
      say(`note on run ${id} saved`, "ok");
      this.noteBox.style.display = "none";
      this.noteRun = null;
      this.ctx.requestPull();
    } else say(`note on run ${id}: ${reply.error ?? "refused"}`, "error");
  }
}
