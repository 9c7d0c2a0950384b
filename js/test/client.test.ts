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
  it("a send that throws (the kernel restarted) answers every request at once, and says so once", async () => {
    const gone: string[] = [];
    let live = true;
    const sent: unknown[] = [];
    // Jupyter's comm after a kernel restart: send throws "Cannot send".
    const model = { send: (c: unknown) => { if (!live) throw new Error("Cannot send"); sent.push(c); } };
    const c = new Client(model, 60000, (why) => gone.push(why));
    const waiting = c.request({ type: "op", op: "stop", run_id: 1 }); // sent, no reply yet
    live = false;
    const pull = await c.pull(5, 0);
    expect(pull.ok).toBe(false);
    expect(pull.disconnected).toBe(true);
    expect(pull.error).toMatch(/kernel restarted or shut down/);
    expect(pull.error).not.toMatch(/Cannot send/);
    expect(gone).toEqual(["kernel restarted or shut down"]);
    // The click that was waiting for its reply is answered too: it will never come.
    expect((await waiting).disconnected).toBe(true);
    expect(c.disconnected).toBe(true);
    expect(c.canPull(100000)).toBe(false);
    // Later requests are refused without touching the dead comm.
    const later = await c.request({ type: "op", op: "resume", run_id: 1 });
    expect(later.error).toMatch(/^not delivered/);
    expect(sent).toHaveLength(1);
    expect(gone).toHaveLength(1);
  });
});
