/**
 * The view's side of the panel protocol (rapidfire_nb/notebook/panel.py): requests with ids,
 * replies matched to them, and the pull loop.
 *
 * Python pushes `{"type": "events"}` from a publisher thread, but some front-ends (Colab) do not
 * deliver messages sent from background threads, so the view also pulls "events since seq N" on a
 * timer. Only one pull is in flight at a time: while a cell is executing, the kernel queues our
 * messages, and a timer that kept sending would pile up a backlog to answer later.
 */

export interface Reply {
  type: "reply";
  request_id: string | number | null;
  ok: boolean;
  error: string | null;
  [key: string]: unknown;
}

export interface ModelLike {
  send(content: unknown): void;
}

let viewCounter = 0;

export class Client {
  private readonly prefix: string;
  private counter = 0;
  private readonly waiting = new Map<string, { resolve: (r: Reply) => void; timer: ReturnType<typeof setTimeout> }>();
  private pullInFlight: string | null = null;
  private pullSentAt = 0;

  /** Set once a send failed: the comm is gone (kernel restarted or shut down) for good. */
  private gone: string | null = null;

  /**
   * `onGone` is told once, when a send fails: Jupyter's comm throws ("Cannot send") after the
   * kernel restarted or shut down, and it never comes back, so every later request is refused
   * at once instead of waiting for a reply that cannot come.
   */
  constructor(private readonly model: ModelLike, private readonly timeoutMs = 60000,
              private readonly onGone: (why: string) => void = () => {}) {
    // Replies reach every view of the widget; the prefix lets each view recognise its own.
    viewCounter += 1;
    this.prefix = `v${viewCounter}-${Math.random().toString(36).slice(2, 8)}`;
  }

  /** Send a request; resolves with Python's reply, or a synthetic error reply on timeout. */
  request(content: Record<string, unknown>): Promise<Reply> {
    this.counter += 1;
    const id = `${this.prefix}-${this.counter}`;
    if (this.gone !== null) return Promise.resolve(this.goneReply(id));
    return new Promise<Reply>((resolve) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        resolve({
          type: "reply",
          request_id: id,
          ok: false,
          error: "no reply from the kernel yet (is a cell still running? buttons act once it finishes)",
        });
      }, this.timeoutMs);
      this.waiting.set(id, { resolve, timer });
      try {
        this.model.send({ ...content, request_id: id });
      } catch {
        // The comm's own words ("Cannot send") tell a user nothing the sentence does not.
        this.markGone("kernel restarted or shut down");
      }
    });
  }

  /** Whether the connection to the kernel is known to be gone. */
  get disconnected(): boolean {
    return this.gone !== null;
  }

  /** No reply can come any more: answer everything waiting, and every later request, at once. */
  markGone(why: string): void {
    if (this.gone !== null) return;
    this.gone = why;
    for (const [id, { resolve, timer }] of this.waiting) {
      clearTimeout(timer);
      resolve(this.goneReply(id));
    }
    this.waiting.clear();
    this.onGone(why);
  }

  private goneReply(id: string): Reply {
    return { type: "reply", request_id: id, ok: false, error: `not delivered: ${this.gone}`, disconnected: true };
  }

  /** Route an incoming reply to its request; false if it belongs to another view. */
  handleReply(msg: Reply): boolean {
    const id = typeof msg.request_id === "string" ? msg.request_id : null;
    if (id === null) return false;
    const entry = this.waiting.get(id);
    if (!entry) return false;
    clearTimeout(entry.timer);
    this.waiting.delete(id);
    entry.resolve(msg);
    return true;
  }

  /** Whether a new pull may be sent now (none in flight, or the one in flight is stale). */
  canPull(now: number, staleMs = 20000): boolean {
    if (this.gone !== null) return false;
    return this.pullInFlight === null || now - this.pullSentAt > staleMs;
  }

  pull(since: number, now: number): Promise<Reply> {
    const p = this.request({ type: "pull", since });
    this.pullInFlight = `${this.prefix}-${this.counter}`;
    this.pullSentAt = now;
    const mine = this.pullInFlight;
    return p.finally(() => {
      if (this.pullInFlight === mine) this.pullInFlight = null;
    });
  }

  dispose(): void {
    for (const { timer } of this.waiting.values()) clearTimeout(timer);
    this.waiting.clear();
  }
}
