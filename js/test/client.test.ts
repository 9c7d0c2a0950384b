// The view's request/reply matching and single-pull-in-flight rule (src/client.ts).
import { describe, expect, it, vi } from "vitest";
import { Client, type Reply } from "../src/client";

function fakeKernel() {
  const sent: Record<string, unknown>[] = [];
  return { sent, model: { send: (c: unknown) => void sent.push(c as Record<string, unknown>) } };
}

describe("Client", () => {
  it("matches replies to requests and ignores other views' replies", async () => {
    const { sent, model } = fakeKernel();
    const a = new Client(model);
    const b = new Client(model);
    const pa = a.request({ type: "editable", run_id: 1 });
    const pb = b.request({ type: "editable", run_id: 2 });
    expect(sent).toHaveLength(2);
    expect(sent[0].request_id).not.toBe(sent[1].request_id);
    const replyB: Reply = { type: "reply", request_id: sent[1].request_id as string, ok: true, error: null, knobs: {} };
    expect(a.handleReply(replyB)).toBe(false);
    expect(b.handleReply(replyB)).toBe(true);
    expect(b.handleReply(replyB)).toBe(false); // a second copy is not delivered twice
    expect(await pb).toBe(replyB);
    a.handleReply({ type: "reply", request_id: sent[0].request_id as string, ok: false, error: "no run 1" });
    expect((await pa).error).toBe("no run 1");
  });

  it("keeps one pull in flight and times out into an error reply", async () => {
    vi.useFakeTimers();
    try {
      const { sent, model } = fakeKernel();
      const c = new Client(model, 1000);
      const p = c.pull(0, 0);
      expect(sent[0]).toMatchObject({ type: "pull", since: 0 });
      expect(c.canPull(10)).toBe(false);
      expect(c.canPull(30000)).toBe(true); // a pull stuck this long is presumed lost
      vi.advanceTimersByTime(1001);
      const r = await p;
      expect(r.ok).toBe(false);
      expect(r.error).toMatch(/no reply/);
      expect(c.canPull(20)).toBe(true);
    } finally {
      vi.useRealTimers();
    }
  });
});
