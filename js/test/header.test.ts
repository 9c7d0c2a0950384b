// @vitest-environment happy-dom
// The panel's header: what its status word says for a live, an ended and a read-only experiment.
import { describe, expect, it } from "vitest";
import { HeaderView } from "../src/header";
import { applySnapshot, createState } from "../src/state";

describe("the header's status word", () => {
  it("says live, then read-only with how to steer instead, for a folder opened for its results", () => {
    const state = createState();
    applySnapshot(state, { experiment: "sft", path: "/data/exps/sft", last_seq: 4 });
    const header = new HeaderView();
    header.render(state, null);
    const live = header.el.querySelector<HTMLElement>("[data-testid=rf-live]")!;
    expect(live.textContent).toBe("live · seq 0 / 4");
    applySnapshot(state, { read_only: true });
    header.render(state, null);
    expect(live.textContent).toBe("read-only · seq 0 / 4");
    expect(live.title).toContain('Experiment("sft", experiment_path="/data/exps", resume=True)');
    expect(live.title).toContain(".refresh()");
    expect(live.classList.contains("rf-read-only")).toBe(true);
  });

  it("ignores a read_only that is not a boolean", () => {
    const state = createState();
    applySnapshot(state, { read_only: "yes" });
    expect(state.readOnly).toBe(false);
  });
});
