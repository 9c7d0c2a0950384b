/**
 * What every view of one panel reads: the folded experiment state, what the user focuses on
 * (hovered, pinned and hidden runs, the "hide:" filters), and whether the panel still has a
 * kernel behind it. One object, so that a view sees a disconnect or a pin the moment it happens
 * instead of through a copy.
 */
import { createState, type PanelState } from "./state";
import type { Focus } from "./table";

export interface Session {
  readonly state: PanelState;
  readonly focus: Focus;
  /** Set once the kernel side is gone (restart, shutdown, closed comm): nothing can be sent. */
  disconnected: string | null;
  /** Set when the view is torn down: late replies and timers do nothing. */
  disposed: boolean;
}

export function createSession(): Session {
  return {
    state: createState(),
    focus: { hover: null, pinned: new Set(), hiddenRuns: new Set(), hide: { stopped: false, pruned: false, deleted: false } },
    disconnected: null,
    disposed: false,
  };
}
