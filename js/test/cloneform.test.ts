// The clone form's Create click versus debounced validation in flight (review_panel.md finding 1).
import { describe, expect, it } from "vitest";
import type { Reply } from "../src/client";
import { CloneSubmitter, type ClonePayload } from "../src/cloneform";

/** A fake Python side whose replies the test releases by hand, in any order. */
function harness(opts: { refuse?: string } = {}) {
  const sent: { payload: ClonePayload; validateOnly: boolean; release: () => void }[] = [];
  const created: ClonePayload[] = [];
  let open = true;
  let form = { changes: { learning_rate: 0.001 } as Record<string, unknown>, ok: true, warm_start: false };
  const sub = new CloneSubmitter({
    collect: () => form,
    isOpen: () => open,
    send: (payload, validateOnly) =>
      new Promise<Reply>((resolve) => {
        sent.push({
          payload, validateOnly,
          release: () => {
            if (opts.refuse) return resolve({ type: "reply", request_id: "x", ok: false, error: opts.refuse });
            if (!validateOnly) created.push(payload);
            resolve({ type: "reply", request_id: "x", ok: true, error: null, new_run_id: validateOnly ? undefined : 5 });
          },
        });
      }),
  });
  return { sub, sent, created, setForm: (f: typeof form) => (form = f), close: () => (open = false) };
}

describe("Create clone with validation in flight", () => {
  it("creates when a debounced check starts after the click and its reply comes first", async () => {
    const t = harness();
    const clicked = t.sub.submit();
    const debounced = t.sub.check(); // the 400 ms timer fired while the click waits for Python
    t.sent[1].release();
    t.sent[0].release();
    expect(await clicked).toEqual({ kind: "created", newRunId: 5 });
    expect(await debounced).toEqual({ kind: "stale" });
    expect(t.created).toHaveLength(1);
  });

  it("creates when a check was already in flight at the click, whatever order replies come in", async () => {
    for (const order of [[0, 1], [1, 0]]) {
      const t = harness();
      const before = t.sub.check();
      const clicked = t.sub.submit();
      for (const i of order) t.sent[i].release();
      expect(await clicked).toEqual({ kind: "created", newRunId: 5 });
      expect(await before).toEqual({ kind: "stale" });
      expect(t.sent.map((s) => s.validateOnly)).toEqual([true, false]);
      expect(t.created).toEqual([{ changes: { learning_rate: 0.001 }, warm_start: false }]);
    }
  });

  it("submits what the form holds at the click, warm start included", async () => {
    const t = harness();
    t.setForm({ changes: { learning_rate: 0.002 }, ok: true, warm_start: true });
    const clicked = t.sub.submit();
    t.sent[0].release();
    await clicked;
    expect(t.created).toEqual([{ changes: { learning_rate: 0.002 }, warm_start: true }]);
  });

  it("says why not: a parse error sends nothing, a refusal carries Python's reason", async () => {
    const bad = harness();
    bad.setForm({ changes: {}, ok: false, warm_start: false });
    expect(await bad.sub.submit()).toEqual({ kind: "parse-error" });
    expect(bad.sent).toHaveLength(0);

    const refused = harness({ refuse: "ValueError: learning_rate must be > 0" });
    const clicked = refused.sub.submit();
    refused.sent[0].release();
    expect(await clicked).toEqual({ kind: "refused", error: "ValueError: learning_rate must be > 0" });
  });

  it("a newer check supersedes an older one; a check alone still reports valid or refused", async () => {
    const t = harness();
    const first = t.sub.check();
    const second = t.sub.check();
    t.sent[0].release();
    t.sent[1].release();
    expect(await first).toEqual({ kind: "stale" });
    expect(await second).toEqual({ kind: "valid" });
    const r = harness({ refuse: "no" });
    const c = r.sub.check();
    r.sent[0].release();
    expect(await c).toEqual({ kind: "refused", error: "no" });
  });

  it("a form closed while the create is in flight reports closed", async () => {
    const t = harness();
    const clicked = t.sub.submit();
    t.close();
    t.sent[0].release();
    expect(await clicked).toEqual({ kind: "closed" });
  });
});
