/**
 * The message line under the run table: the answer to a click, or an error.
 *
 * An answer ("stop run 3: accepted") goes stale once the run has moved on: it clears itself after
 * a while; an error stays until the next message.
 */
import { h } from "./dom";

/** How long an answer to a click stays in the message line (errors stay). */
const MESSAGE_CLEAR_MS = 15000;

export type MessageKind = "ok" | "error" | "note";

export class MessageLine {
  readonly el = h("div", { class: "rf-messages", "data-testid": "rf-messages" });
  private timer: ReturnType<typeof setTimeout> | undefined;

  say(text: string, kind: MessageKind = "note"): void {
    const el = this.el;
    el.textContent = text;
    el.className = `rf-messages ${kind === "error" ? "rf-error" : kind === "ok" ? "rf-ok" : "rf-note"}`;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = kind === "error" ? undefined : setTimeout(() => {
      this.timer = undefined;
      if (el.textContent === text) el.textContent = "";
    }, MESSAGE_CLEAR_MS);
  }

  /** Clear an answer, keep an error (on disconnect: the answers are about a panel now gone). */
  clearAnswer(): void {
    if (!this.el.classList.contains("rf-error")) this.el.textContent = "";
  }

  dispose(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
  }
}
