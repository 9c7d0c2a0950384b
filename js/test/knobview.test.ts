// Knobs -> metric: which knobs show (only those that vary), each run's best or latest value,
// the marks of pruned, stopped and failed runs, runs with a NaN or missing metric, and the hit test.
import { describe, expect, it } from "vitest";
import { axisPos, axisTicks, DEFAULT_LABEL, fmtKnob, knobHit, knobLayout, knobModel, pointPx, roughMeasure, wrapLabel } from "../src/knobview";
import { createState, ingest, type WireEvent } from "../src/state";

function log(): WireEvent[] {
  const ev: Omit<WireEvent, "seq">[] = [];
  const lrs = [1e-4, 1e-3, 1e-2, 3e-3, 5e-4];
  lrs.forEach((lr, i) => ev.push({ type: "run_created", run_id: i + 1,
    knobs: { "training_args.learning_rate": lr, "peft_config.r": i % 2 ? 16 : 8, "training_args.beta": 0.1, "training_args.lr_scheduler_type": i < 2 ? "cosine" : "linear" } }));
  const losses = [2.0, 1.5, 3.0, null, 1.8];
  losses.forEach((v, i) => ev.push({ type: "metric", run_id: i + 1, split: "eval", step: 2, samples_seen: 8, metrics: { eval_loss: v } }));
  ev.push({ type: "metric", run_id: 1, split: "eval", step: 4, samples_seen: 16, metrics: { eval_loss: 2.5 } });
  ev.push({ type: "run_status", run_id: 2, status: "stopped", reason: "pruned at chunk 2 (below the median)", pruned: true });
  ev.push({ type: "run_status", run_id: 3, status: "failed", has_error: true });
  ev.push({ type: "run_status", run_id: 5, status: "stopped" });
  return ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent);
}

describe("knobs -> metric", () => {
  const state = createState();
  ingest(state, log());

  it("leaves out a knob that never varies, scales lr on a log axis", () => {
    const m = knobModel(state, "eval_loss", "best");
    expect(m.axes.map((a) => a.key).sort()).toEqual(["peft_config.r", "training_args.learning_rate", "training_args.lr_scheduler_type"]);
    const lr = m.axes.find((a) => a.key === "training_args.learning_rate")!;
    expect(lr.kind).toBe("log");
    expect(axisPos(lr, 1e-4)).toBe(0);
    expect(axisPos(lr, 1e-2)).toBe(1);
    const sched = m.axes.find((a) => a.key.endsWith("lr_scheduler_type"))!;
    expect(sched.kind).toBe("category");
    expect(axisPos(sched, "cosine")).toBe(0);
    expect(m.axes.find((a) => a.key === "peft_config.r")!.kind).toBe("linear");
  });

  it("takes the best or the latest value, marks pruned, stopped and failed runs, counts missing ones", () => {
    const best = knobModel(state, "eval_loss", "best");
    expect(best.points.map((p) => [p.runId, p.value, p.mark])).toEqual([
      [1, 2.0, "run"], [2, 1.5, "pruned"], [3, 3.0, "failed"], [5, 1.8, "stopped"]]);
    expect(best.missing).toEqual([4]);   // its eval_loss is NaN (null on the wire)
    expect(knobModel(state, "eval_loss", "latest").points[0].value).toBe(2.5);
    expect(knobModel(state, "bleu", "best").missing).toEqual([1, 2, 3, 4, 5]);
  });

  it("finds the point under the pointer", () => {
    const m = knobModel(state, "eval_loss", "best");
    const { cells } = knobLayout(m, 640);
    expect(cells.length).toBe(3);
    const p = m.points.find((q) => q.runId === 5)!;
    const at = pointPx(m, cells[1], p)!;
    expect(knobHit(m, cells, at[0] + 2, at[1] - 2)?.runId).toBe(5);
    expect(knobHit(m, cells, at[0] + 30, at[1] + 30)).toBeNull();
  });

  it("shows a knob older runs lack as the default, in its own slot, never as null or a number", () => {
    const st = createState();
    const ev: Omit<WireEvent, "seq">[] = [
      { type: "run_created", run_id: 1, knobs: { "training_args.learning_rate": 1e-3 } },
      { type: "run_created", run_id: 2, knobs: { "training_args.learning_rate": 1e-3, "training_args.weight_decay": 0.01 } },
      { type: "run_created", run_id: 3, knobs: { "training_args.learning_rate": 1e-3, "training_args.weight_decay": 0.1 } },
      { type: "run_created", run_id: 4, knobs: { "training_args.learning_rate": 1e-3, "training_args.lr_scheduler_type": "cosine" } },
    ];
    [1, 2, 3, 4].forEach((id) => ev.push({ type: "metric", run_id: id, split: "eval", step: 2, samples_seen: 8, metrics: { eval_loss: id } }));
    ingest(st, ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent));
    const m = knobModel(st, "eval_loss", "best");
    const wd = m.axes.find((a) => a.key === "training_args.weight_decay")!;
    // the numbers keep a number axis (not categories "0.01", "0.1", "null")
    expect(wd.kind).toBe("linear");
    expect(wd.defaults).toBe(true);
    expect(axisPos(wd, undefined)).toBe(0);
    expect(axisPos(wd, null)).toBe(0);
    expect(axisPos(wd, 0.01)!).toBeGreaterThan(0.15);
    expect(axisPos(wd, 0.1)).toBe(1);
    const labels = axisTicks(wd).map(([, l]) => l);
    expect(labels).toEqual([DEFAULT_LABEL, "0.01", "0.1"]);
    const sched = m.axes.find((a) => a.key.endsWith("lr_scheduler_type"))!;
    expect(sched.categories).toEqual([DEFAULT_LABEL, "cosine"]);
    expect(axisPos(sched, undefined)).toBe(0);
    expect(fmtKnob(null)).toBe(DEFAULT_LABEL);
    expect(fmtKnob(undefined)).toBe(DEFAULT_LABEL);
    // every run is drawn on every axis (run 1 at both default slots)
    const { cells } = knobLayout(m, 600);
    for (const c of cells) for (const p of m.points) expect(pointPx(m, c, p)).not.toBeNull();
  });

  it("reads a knob only a later clone varies from the older runs' own settings, not as the default", () => {
    const st = createState();
    const settings = { "training_args.num_train_epochs": 2, "peft_config.target_modules": ["q_proj", "v_proj"] };
    const ev: Omit<WireEvent, "seq">[] = [
      { type: "run_created", run_id: 1, knobs: { "training_args.learning_rate": 1e-3 }, settings: { ...settings, "training_args.learning_rate": 1e-3 } },
      { type: "run_created", run_id: 2, knobs: { "training_args.learning_rate": 1e-2 }, settings: { ...settings, "training_args.learning_rate": 1e-2 } },
      // a clone of run 1 that changes the epochs and the modules
      { type: "run_created", run_id: 3, parent_run_id: 1, knobs: { "training_args.learning_rate": 1e-3, "training_args.num_train_epochs": 3, "peft_config.target_modules": ["q_proj"] },
        settings: { "training_args.learning_rate": 1e-3, "training_args.num_train_epochs": 3, "peft_config.target_modules": ["q_proj"] } },
    ];
    [1, 2, 3].forEach((id) => ev.push({ type: "metric", run_id: id, split: "eval", step: 2, samples_seen: 8, metrics: { eval_loss: id } }));
    ingest(st, ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent));
    const m = knobModel(st, "eval_loss", "best");
    const epochs = m.axes.find((a) => a.key === "training_args.num_train_epochs")!;
    expect(epochs.defaults).toBe(false);
    expect(axisTicks(epochs).map(([, l]) => l)).toEqual(["2", "3"]);
    // the clone changed both at once: one plot, on the number knob, naming the other
    expect(epochs.linked).toEqual(["peft_config.target_modules"]);
    expect(m.axes.map((a) => a.key).sort()).toEqual(["training_args.learning_rate", "training_args.num_train_epochs"]);
  });
});

// The quickstart's grid: two LoRA configs (r, lora_alpha and target_modules set together) x two
// learning rates, then a clone of run 1 at half its learning rate.
function quickstartLog(): WireEvent[] {
  const small = { "peft_config.r": 8, "peft_config.lora_alpha": 16, "peft_config.target_modules": ["q_proj", "v_proj"] };
  const big = { "peft_config.r": 32, "peft_config.lora_alpha": 64,
    "peft_config.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] };
  const ev: Omit<WireEvent, "seq">[] = [];
  [[small, 2e-2], [big, 2e-2], [small, 5e-3], [big, 5e-3], [small, 1e-2]].forEach(([lora, lr], i) =>
    ev.push({ type: "run_created", run_id: i + 1, ...(i === 4 ? { parent_run_id: 1 } : {}),
      knobs: { ...(lora as object), "training_args.learning_rate": lr } }));
  [0.6, 0.5, 2.4, 0.45, 0.4].forEach((v, i) => ev.push({ type: "metric", run_id: i + 1, split: "eval", step: 2, samples_seen: 8, metrics: { eval_loss: v } }));
  return ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent);
}

describe("knobs that vary together", () => {
  const state = createState();
  ingest(state, quickstartLog());
  const m = knobModel(state, "eval_loss", "best");

  it("share one plot, on r, naming lora_alpha and target_modules", () => {
    expect(m.axes.map((a) => a.key)).toEqual(["peft_config.r", "training_args.learning_rate"]);
    expect(m.axes[0].linked).toEqual(["peft_config.lora_alpha", "peft_config.target_modules"]);
    expect(m.axes[1].linked).toEqual([]);
    const { cells } = knobLayout(m, 640);
    expect(cells.length).toBe(2);
    expect(cells[0].title.join(" ")).toBe("r · lora_alpha · target_modules");
  });

  it("keeps apart knobs a grid crosses, even with as many values each", () => {
    const st = createState();
    const ev: Omit<WireEvent, "seq">[] = [];
    [[8, 1e-3], [8, 1e-2], [16, 1e-3], [16, 1e-2]].forEach(([r, lr], i) =>
      ev.push({ type: "run_created", run_id: i + 1, knobs: { "peft_config.r": r, "training_args.learning_rate": lr } }));
    ingest(st, ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent));
    expect(knobModel(st, "eval_loss", "best").axes.map((a) => a.linked.length)).toEqual([0, 0]);
  });

  it("draws every label inside its cell, none over another", () => {
    // a lone target_modules knob, whose lists are the longest labels
    const st = createState();
    const lists = [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], ["q_proj"]];
    const ev: Omit<WireEvent, "seq">[] = lists.map((l, i) => ({ type: "run_created", run_id: i + 1,
      knobs: { "peft_config.target_modules": l, "training_args.learning_rate": [1e-3, 1e-3, 1e-2][i], "peft_config.r": [8, 16, 16][i] } }));
    ingest(st, ev.map((e, i) => ({ ...e, seq: i + 1 }) as WireEvent));
    for (const model of [m, knobModel(st, "eval_loss", "best")]) {
      for (const width of [200, 420, 640, 1200]) {
        const { cells, height } = knobLayout(model, width);
        for (const c of cells) {
          expect(c.top + c.height).toBeLessThanOrEqual(height);
          const spans = c.ticks.map((t) => {
            const w = Math.max(...t.lines.map((l) => roughMeasure(l)));
            return [t.x - w / 2, t.x + w / 2];
          });
          for (const [a, b] of spans) {
            expect(a).toBeGreaterThanOrEqual(c.left);
            expect(b).toBeLessThanOrEqual(c.left + c.width);
          }
          for (let i = 1; i < spans.length; i++) expect(spans[i][0]).toBeGreaterThan(spans[i - 1][1]);
          for (const line of c.title) expect(roughMeasure(line)).toBeLessThanOrEqual(c.width - 8);
        }
      }
    }
  });

  it("wraps a long label at its commas and cuts only what no line can hold", () => {
    const long = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
    const lines = wrapLabel(long, 100);
    expect(lines.length).toBe(3);
    for (const l of lines) expect(roughMeasure(l)).toBeLessThanOrEqual(100);
    expect(lines[0]).toBe("q_proj, k_proj,");
    expect(lines[2].endsWith("…")).toBe(true);
    expect(wrapLabel("q_proj, v_proj", 200)).toEqual(["q_proj, v_proj"]);
    expect(wrapLabel("0.0005", 200)).toEqual(["0.0005"]);
  });
});
