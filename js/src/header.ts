/**
 * The panel's header: the experiment's name, a coloured count per run status (and the pruner's
 * pending suggestions), whether the panel is live and how far it has read, and the banner that
 * replaces all of that once the kernel side is gone.
 */
import { h } from "./dom";
import { STATUS_COLORS } from "./palette";
import type { PanelState } from "./state";
import { suggestedRuns } from "./suggest";
import { headerCounts, headerCountTitle } from "./table";

/** The call that reopens this experiment after a restart: its name and the folder it lies in. */
export function resumeCall(name: string | null, path: string | null): string {
  const parent = path !== null ? path.replace(/[\\/]+$/, "").replace(/[\\/][^\\/]*$/, "") : "";
  const where = parent !== "" && parent !== path ? `, experiment_path=${JSON.stringify(parent)}` : "";
  return `Experiment(${name !== null ? JSON.stringify(name) : "NAME"}${where}, resume=True)`;
}

export class HeaderView {
  private readonly title = h("span", { class: "rf-title", text: "RapidFire" });
  private readonly counts = h("span", { class: "rf-counts" });
  private readonly live = h("span", { class: "rf-live", "data-testid": "rf-live", text: "connecting…" });
  readonly el = h("div", { class: "rf-header" }, [this.title, this.counts, this.live]);
  readonly banner = h("div", { class: "rf-banner", "data-testid": "rf-disconnected" });

  constructor() {
    this.banner.style.display = "none";
  }

  render(state: PanelState, disconnected: string | null): void {
    const { counts, live } = this;
    this.title.textContent = state.experiment ? `RapidFire · ${state.experiment}` : "RapidFire";
    counts.replaceChildren(
      ...headerCounts(state).map(([text, s]) => {
        const span = h("span", { class: "rf-count", text });
        span.style.background = STATUS_COLORS[s];
        const title = headerCountTitle(state, s);
        if (title) span.title = title;
        return span;
      }),
    );
    const asked = suggestedRuns(state);
    if (asked.length) {
      const span = h("span", { class: "rf-count rf-count-suggest", "data-testid": "rf-suggested-count",
        text: `${asked.length} suggested to stop` });
      span.title = `the pruner suggests stopping run${asked.length > 1 ? "s" : ""} ${asked.join(", ")}: Confirm or Ignore on each row`;
      counts.append(span);
    }
    if (disconnected !== null) {
      live.textContent = "disconnected";
      return;
    }
    const mode = state.readOnly ? "read-only" : state.ended ? "ended" : "live";
    live.textContent = `${mode} · seq ${state.lastSeq}${state.knownSeq > state.lastSeq ? ` / ${state.knownSeq}` : ""}`;
    live.classList.toggle("rf-read-only", state.readOnly);
    if (state.readOnly) {
      live.title = "opened read-only (Experiment.open): the runs as its log said when it was read "
        + "(.refresh() on it reads what was logged since); nothing here steers them, so the buttons are off. "
        + "Steer with the Experiment that trains it (its own panel), or, when nothing trains it, "
        + `reopen it with ${resumeCall(state.experiment, state.path)}`;
    } else if (live.title === "") {
      live.title = "seq: how many events of the experiment's log this panel has read";
    }
  }

  /** A pull was answered: the kernel is there (the next render says what was read). */
  answered(): void {
    this.live.title = "";
  }

  /** A pull was refused or timed out: the kernel is busy or gone, which the next pulls tell. */
  waiting(why: string | undefined): void {
    this.live.textContent = "waiting for the kernel…";
    this.live.title = why ?? "";
  }

  /** The kernel side is gone: the banner says how to get a live panel, or the runs, back. */
  disconnected(why: string, state: PanelState): void {
    // Re-running the run_fit cell as it is starts a new experiment from scratch; after a restart
    // what continues the runs is resume=True with this experiment's folder, so the banner names
    // both, as code to copy.
    this.banner.replaceChildren(
      `${why}: this panel no longer controls anything. If the kernel still runs, `,
      h("code", { text: "%rapidfire panel" }), " shows a live one. After a restart, ",
      h("code", { text: resumeCall(state.experiment, state.path) }),
      " and the same run_fit(...) continue the unfinished runs from their last chunk boundary "
      + "(re-running the cell as it is starts a new experiment from scratch).",
    );
    this.banner.style.display = "";
    this.live.textContent = "disconnected";
    this.live.title = why;
    // the counts are the last ones seen, not what trains now
    this.counts.title = "as last seen before the kernel went away; nothing here is live";
  }
}
