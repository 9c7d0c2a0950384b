/**
 * The rapidfire_nb control panel: an anywidget ESM view (`render({model, el})`, returns its cleanup).
 *
 * Works the same in JupyterLab, Notebook 7, VS Code and Colab because it uses only the plain
 * anywidget model API (`model.get/on/off/send`). The state lives in ./state.ts (tested alone) and
 * is kept current by ./sync.ts (pushes, pulls, the snapshot); every part of the panel is a view of
 * its own: the header (./header.ts), the charts (./chartview.ts) and their key (./legend.ts), the
 * run table (./tableview.ts), the boxes below it (./cloneview.ts, ./tracebackview.ts,
 * ./timesplit.ts, ./timeline.ts, ./knobview.ts, ./generationsview.ts) and the worker notices
 * (./workers.ts). This file
 * builds them, wires them together, and redraws them in one animation frame (./frames.ts).
 */
import type { RenderProps } from "@anywidget/types";
import { Client } from "./client";
import { CSS } from "./style";
import { h } from "./dom";
import { createCloneEditor } from "./cloneview";
import { createTracebackView } from "./tracebackview";
import { createTimeSplitView } from "./timesplit";
import { createRunTable } from "./tableview";
import { createWorkerNotices } from "./workers";
import { createTimelineView } from "./timeline";
import { createKnobView } from "./knobview";
import { createGenerationsView } from "./generationsview";
import { createChartBook } from "./chartplan";
import { ChartArea } from "./chartview";
import { FrameScheduler, type Parts, type UpdateTiming } from "./frames";
import { HeaderView } from "./header";
import { Legend } from "./legend";
import { MessageLine, type MessageKind } from "./messages";
import { createSession } from "./session";
import { applySnapshot } from "./state";
import { Sync, type Model } from "./sync";
import { knobColumns, runShown } from "./table";
import { loadPrefs, prefsKey, savePrefs } from "./viewprefs";

function render({ model, el }: RenderProps<{ snapshot: Record<string, unknown> }>): () => void {
  const m = model as Model;
  const session = createSession();
  const { state, focus } = session;
  const client = new Client(m, undefined, (why) => disconnect(why));
  const messages = new MessageLine();
  const say = (text: string, kind?: MessageKind) => messages.say(text, kind);
  const frames = new FrameScheduler({
    draw, isDisposed: () => session.disposed, runs: () => state.runs.size,
    onError: (err) => say(`panel render error: ${String(err)}`, "error"),
  });
  const scheduleRender = (what: Partial<Parts>) => frames.schedule(what);
  const requestPull = () => sync.requestPull();

  const style = h("style", { text: CSS });
  const root = h("div", { class: "rf-panel", "data-testid": "rf-panel" });
  el.append(style, root);
  // The browser test reads these off the panel element (performance.now() around each update).
  (root as unknown as { rfTimings: UpdateTiming[] }).rfTimings = frames.timings;

  const header = new HeaderView();
  root.append(header.el, header.banner);

  // --- the charts and their key; hovering a curve or a key entry lights up the run's row --------
  const charts = new ChartArea({
    session, scheduleRender, noteCall: frames.noteCall, say, persistPrefs: () => persistPrefs(),
    onHover: (id) => runTable.highlight(id),
  }, [
    { book: createChartBook("train"), label: "train", preferred: "loss" },
    { book: createChartBook("eval"), label: "eval", preferred: "eval_loss" },
  ]);
  const legend = new Legend({
    session, client, say, requestPull,
    onHover: (id) => {
      runTable.highlight(id);
      charts.emphasizeAll();
    },
  });
  root.append(charts.curveBar, charts.row, legend.el, legend.noteBox);

  // --- run table (./tableview.ts), and what it shares with the charts --------------------------
  const runTable = createRunTable({
    state, client, focus,
    metric: () => charts.evalMetric(),
    disconnected: () => session.disconnected,
    scheduleRender,
    emphasize: () => {
      charts.emphasizeAll();
      updateGenerations();
    },
    hiddenChanged: () => {
      charts.updateSelects();
      charts.emphasizeAll();
      legend.render();
    },
    persistPrefs: () => persistPrefs(),
    say,
    requestPull,
    openClone: (runId) => void cloneEditor.open(runId),
    showTraceback: (runId) => void traceback.show(runId),
  });
  root.append(runTable.filterBox, runTable.wrap, messages.el);

  // --- clone editor, traceback, time split (views of their own) --------------------------------
  const cloneEditor = createCloneEditor({
    client, knobColumns: () => knobColumns(state), say, requestPull, isDisposed: () => session.disposed,
    disconnected: () => session.disconnected !== null,
  });
  const traceback = createTracebackView(client);
  const timeSplit = createTimeSplitView({ requestDraw: () => scheduleRender({ time: true }), noteCall: frames.noteCall });
  root.append(cloneEditor.el, traceback.el, timeSplit.details);

  // --- Ray workers: lost-worker notices above the filters, the chunk timeline ----------
  // Both are redrawn with the header (every applied batch); the timeline keeps its own redraw
  // cadence, drawing nothing while folded.
  const workerNotices = createWorkerNotices();
  runTable.filterBox.before(workerNotices.el);
  const timeline = createTimelineView();
  root.append(timeline.details);
  // Knobs -> metric: a point's hover lights up the run as hovering its row does; a click pins it
  // as a click on its row does (the row shows it pinned, the curves stay emphasized).
  const knobView = createKnobView({
    onHover: (id) => {
      focus.hover = id;
      runTable.highlight(id);
      charts.emphasizeAll();
    },
    onPick: (id) => {
      if (focus.pinned.has(id)) focus.pinned.delete(id);
      else focus.pinned.add(id);
      const row = runTable.wrap.querySelector(`tr[data-run-id="${id}"]`);
      row?.classList.toggle("rf-pinned", focus.pinned.has(id));
      charts.emphasizeAll();
      knobView.update(state, focus.pinned);
    },
  });
  root.append(knobView.details);
  // Generations side by side: a column per run the table shows (its "hide:" filters apply); a
  // column header lights up and pins the run as the knob view's points do.
  const generations = createGenerationsView({
    onHover: (id) => {
      focus.hover = id;
      runTable.highlight(id);
      charts.emphasizeAll();
    },
    onPick: (id) => {
      if (focus.pinned.has(id)) focus.pinned.delete(id);
      else focus.pinned.add(id);
      const row = runTable.wrap.querySelector(`tr[data-run-id="${id}"]`);
      row?.classList.toggle("rf-pinned", focus.pinned.has(id));
      charts.emphasizeAll();
      knobView.update(state, focus.pinned);
      updateGenerations();
    },
  });
  root.append(generations.details);
  function updateGenerations(): void {
    generations.update(state, [...state.runs.values()].filter((r) => runShown(r, focus.hide)), focus.pinned);
  }

  // --- one animation frame redraws whatever changed since the last ------------------------------
  function draw(what: Parts): void {
    if (what.header) renderHeader();
    if (what.charts) {
      charts.render();
      legend.render();
      knobView.update(state, focus.pinned);
    }
    if (what.table) runTable.render();
    if (what.charts || what.table) updateGenerations();
    // In the same frame as the curves and the table: the bars are a few divs a run, rebuilt at
    // most every timeSplitInterval. (Deferring it to a frame without chart or table work, as
    // for Plotly, starved it while events streamed in.)
    if (what.time) timeSplit.render(state);
  }
  function renderHeader(): void {
    header.render(state, session.disconnected);
    workerNotices.render(state);
    timeline.update(state);
  }

  /** The kernel side is gone: grey the panel, say so once, and stop sending. */
  function disconnect(why: string): void {
    if (session.disconnected !== null || session.disposed) return;
    session.disconnected = why;
    sync.stop();
    root.classList.add("rf-disconnected");
    header.disconnected(why, state);
    messages.clearAnswer();
    // Close buttons stay: a box left open on a dead panel must still go away.
    for (const b of root.querySelectorAll<HTMLButtonElement>("button:not([data-role=close])")) b.disabled = true;
    scheduleRender({ header: true, table: true });
  }

  // --- what the user set up, remembered per experiment across re-renders -------------------------
  let prefsAt: string | null = null;
  function persistPrefs(): void {
    savePrefs(prefsAt, { hide: { ...focus.hide }, sort: runTable.sortKey(), groupOpen: runTable.groupOpen(), ...charts.prefs() });
  }
  /** Once the experiment is known (snapshot or first event), bring back what was set up for it. */
  function restorePrefs(): void {
    if (prefsAt !== null) return;
    prefsAt = prefsKey(state.path, state.experiment);
    const prefs = loadPrefs(prefsAt);
    if (prefs === null) return;
    Object.assign(focus.hide, prefs.hide);
    runTable.restore(prefs.sort, prefs.groupOpen);
    charts.restore(prefs);
    scheduleRender({ charts: true, table: true });
  }

  // --- protocol: push, pull, snapshot (./sync.ts) ------------------------------------------------
  const sync = new Sync({
    model: m, client, session, scheduleRender, noteIngest: (t0, applied) => frames.noteIngest(t0, applied), restorePrefs,
    answered: () => header.answered(), waiting: (why) => header.waiting(why), disconnect,
  });
  applySnapshot(state, m.get("snapshot"));
  restorePrefs();
  renderHeader();
  scheduleRender({ charts: true });
  sync.start();

  return () => {
    session.disposed = true;
    sync.dispose();
    timeline.dispose();
    knobView.dispose();
    generations.dispose();
    runTable.dispose();
    charts.dispose();
    client.dispose();
    timeSplit.dispose();
    messages.dispose();
    el.replaceChildren();
  };
}

export default { render };
