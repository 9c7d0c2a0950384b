/** A failed run's traceback, fetched from the kernel when the row's Traceback button is clicked. */
import type { Client } from "./client";
import { closeBox, h, hiddenBox } from "./dom";

export interface TracebackView {
  el: HTMLDivElement;
  show(runId: number): Promise<void>;
}

export function createTracebackView(client: Client): TracebackView {
  const el = hiddenBox("rf-traceback");
  async function show(runId: number): Promise<void> {
    const heading = () => h("h4", { text: `Run ${runId}: traceback` });
    el.style.display = "";
    el.replaceChildren(heading(), h("div", { class: "rf-note", text: "loading…" }));
    const reply = await client.request({ type: "traceback", run_id: runId });
    const close = h("button", { text: "Close", "data-role": "close" });
    close.addEventListener("click", () => closeBox(el));
    const body = reply.ok
      ? h("pre", { class: "rf-traceback", text: typeof reply.traceback === "string" ? reply.traceback : "(no traceback recorded)" })
      : h("div", { class: "rf-error", text: reply.error ?? "failed" });
    el.replaceChildren(heading(), body, h("div", { class: "rf-buttons" }, [close]));
  }
  return { el, show };
}
