// @vitest-environment happy-dom
// The clone editor as a view (./cloneview.ts): on a panel whose kernel is gone, typing in an open
// form must not enable Create, and Close still closes it.
import { describe, expect, it } from "vitest";
import type { Client, Reply } from "../src/client";
import { createCloneEditor } from "../src/cloneview";

describe("the clone editor on a dead panel", () => {
  it("keeps Create disabled whatever is typed, and Close still closes", async () => {
    let gone = false;
    const client = {
      request: async (c: Record<string, unknown>): Promise<Reply> => (c.type === "editable"
        ? { type: "reply", request_id: "x", ok: true, knobs: { "training_args.learning_rate": 0.001 } }
        : { type: "reply", request_id: "x", ok: true }) as Reply,
    } as unknown as Client;
    const editor = createCloneEditor({
      client, knobColumns: () => [], say: () => {}, requestPull: () => {}, isDisposed: () => false,
      disconnected: () => gone,
    });
    document.body.replaceChildren(editor.el);
    await editor.open(1);
    const input = editor.el.querySelector<HTMLInputElement>('input[data-knob="training_args.learning_rate"]')!;
    const create = editor.el.querySelector<HTMLButtonElement>("[data-testid=rf-clone-create]")!;
    input.value = "0.002";
    input.dispatchEvent(new Event("input"));
    expect(create.disabled).toBe(false);
    gone = true;
    input.value = "0.003";
    input.dispatchEvent(new Event("input"));
    expect(create.disabled).toBe(true);
    expect(create.title).toMatch(/kernel is gone/);
    const close = editor.el.querySelector<HTMLButtonElement>("[data-testid=rf-clone-cancel]")!;
    expect(close.dataset.role).toBe("close");   // the panel's disconnect leaves these enabled
    close.click();
    expect(editor.el.style.display).toBe("none");
  });
});

describe("a clone refused by Python", () => {
  it("shows the reason once: in the status line, with the field marked and pointing at it", async () => {
    const reason = "training_args.learning_rate: must be > 0, got -1";
    const client = {
      request: async (c: Record<string, unknown>): Promise<Reply> => (c.type === "editable"
        ? { type: "reply", request_id: "x", ok: true, knobs: { "training_args.learning_rate": 0.001 } }
        : { type: "reply", request_id: "x", ok: false, error: reason }) as Reply,
    } as unknown as Client;
    const editor = createCloneEditor({
      client, knobColumns: () => [], say: () => {}, requestPull: () => {}, isDisposed: () => false,
      disconnected: () => false,
    });
    document.body.replaceChildren(editor.el);
    await editor.open(1);
    const input = editor.el.querySelector<HTMLInputElement>('input[data-knob="training_args.learning_rate"]')!;
    input.value = "-1";
    input.dispatchEvent(new Event("input"));
    editor.el.querySelector<HTMLButtonElement>("[data-testid=rf-clone-create]")!.click();
    const status = editor.el.querySelector<HTMLElement>("[data-testid=rf-clone-status]")!;
    for (let i = 0; i < 50 && !status.textContent?.includes("must be"); i++) await new Promise((ok) => setTimeout(ok, 20));
    expect(status.textContent).toBe(reason);
    expect(input.classList.contains("rf-invalid")).toBe(true);
    expect(editor.el.textContent!.split("must be > 0").length - 1).toBe(1);   // the reason, once
  });
});
