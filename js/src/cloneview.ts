/**
 * The clone editor below the table: the parent's knobs as text fields, checked in Python as they
 * are typed (validate_only builds the real configs and creates nothing), then Create clone.
 */
import type { Client } from "./client";
import { CloneSubmitter, cloneFormKnobs, knobChanges, knobNamedIn } from "./cloneform";
import { closeBox, h, hiddenBox } from "./dom";
import { formatKnobValue, readableKnob } from "./format";

export interface CloneEditor {
  el: HTMLDivElement;
  open(runId: number): Promise<void>;
}

export function createCloneEditor(opts: {
  client: Client;
  /** The knob columns the table shows now: the form lists those first. */
  knobColumns: () => string[];
  say: (text: string, kind: "ok" | "error" | "note") => void;
  requestPull: () => void;
  isDisposed: () => boolean;
  /** Set once the kernel side is gone. */
  disconnected: () => boolean;
}): CloneEditor {
  const el = hiddenBox("rf-clone-editor");
  // Bumped by every open and close: a reply for an editor closed or reopened since is dropped.
  let editorSerial = 0;
  function close(): void {
    editorSerial++;
    closeBox(el);
  }

  async function open(runId: number): Promise<void> {
    const serial = ++editorSerial;
    el.style.display = "";
    // The form opens below the table: bring it into view, or the click seems to do nothing.
    el.scrollIntoView({ block: "nearest", behavior: "smooth" });
    el.replaceChildren(h("h4", { text: `Clone run ${runId}` }), h("div", { class: "rf-note", text: "loading knobs…" }));
    const reply = await opts.client.request({ type: "editable", run_id: runId });
    if (serial !== editorSerial || opts.isDisposed()) return;
    if (!reply.ok || !reply.knobs || typeof reply.knobs !== "object") {
      el.replaceChildren(
        h("h4", { text: `Clone run ${runId}` }),
        h("div", { class: "rf-error", text: reply.error ?? "no editable knobs" }),
        h("div", { class: "rf-buttons" }, [closeButton()]),
      );
      return;
    }
    buildCloneForm(runId, reply.knobs as Record<string, unknown>, serial);
  }

  function closeButton(): HTMLButtonElement {
    const b = h("button", { text: "Close", "data-testid": "rf-clone-cancel", "data-role": "close" });
    b.addEventListener("click", close);
    return b;
  }

  function buildCloneForm(runId: number, original: Record<string, unknown>, serial: number): void {
    const { main, more } = cloneFormKnobs(Object.keys(original), opts.knobColumns());
    const keys = [...main, ...more];
    const inputs = new Map<string, HTMLInputElement>();
    const fieldErrors = new Map<string, HTMLSpanElement>();
    const field = (k: string, grid: HTMLDivElement) => {
      const input = h("input", { type: "text", "data-knob": k, value: formatKnobValue(original[k]), title: k });
      input.value = formatKnobValue(original[k]);
      const err = h("span", { class: "rf-field-error", "data-error-for": k });
      inputs.set(k, input);
      fieldErrors.set(k, err);
      grid.append(h("label", { text: readableKnob(k), title: k }), input, err);
      input.addEventListener("input", () => scheduleCheck());
    };
    const mainForm = h("div", { class: "rf-form rf-form-main" });
    const moreForm = h("div", { class: "rf-form" });
    for (const k of main) field(k, mainForm);
    for (const k of more) field(k, moreForm);
    const moreBox = h("details", { class: "rf-more" }, [h("summary", { text: `other knobs (${more.length})` }), moreForm]);
    const warm = h("input", { type: "checkbox", "data-testid": "rf-clone-warm" });
    warm.addEventListener("change", () => scheduleCheck());
    const status = h("div", { class: "rf-note", "data-testid": "rf-clone-status" });
    const create = h("button", { class: "rf-primary", text: "Create clone", "data-testid": "rf-clone-create" });
    el.replaceChildren(
      h("h4", { text: `Clone run ${runId}` }),
      keys.length ? mainForm : h("div", { class: "rf-note", text: "this run has no editable knobs" }),
      ...(more.length ? [moreBox] : []),
      h("div", { class: "rf-buttons" }, [
        h("label", {}, [warm, " warm start (continue from the parent's current weights)"]),
      ]),
      h("div", { class: "rf-buttons" }, [create, closeButton()]),
      status,
    );
    el.scrollIntoView({ block: "nearest", behavior: "smooth" });
    // The form opens below the table, away from the row clicked: the keyboard goes with it.
    inputs.values().next().value?.focus({ preventScroll: true });
    let serverError = false;
    const gate = (ok: boolean) => {
      // A dead panel creates nothing, whatever the form holds.
      const off = opts.disconnected();
      create.disabled = !ok || off;
      create.title = off ? "the kernel is gone: nothing can be created from this panel"
        : ok ? "" : "fix the marked fields first";
    };

    function collect(): { changes: Record<string, unknown>; ok: boolean } {
      const edited: Record<string, string> = Object.create(null);
      for (const [k, input] of inputs) edited[k] = input.value;
      const { changes, errors } = knobChanges(original, edited);
      for (const [k, input] of inputs) {
        input.classList.toggle("rf-invalid", k in errors);
        input.classList.toggle("rf-changed", k in changes);
        fieldErrors.get(k)!.textContent = errors[k] ?? "";
      }
      const ok = Object.keys(errors).length === 0;
      gate(ok && !serverError);
      return { changes, ok };
    }

    function showServerError(error: string): void {
      status.className = "rf-error";
      status.textContent = error;
      const k = knobNamedIn(error, keys);
      if (k) {
        inputs.get(k)!.classList.add("rf-invalid");
        // the reason is in the status line below; the field only points at it (not the text twice)
        fieldErrors.get(k)!.textContent = "refused: the reason is below";
      }
    }

    let checkTimer: ReturnType<typeof setTimeout> | undefined;
    const submitter = new CloneSubmitter({
      collect: () => ({ ...collect(), warm_start: warm.checked }),
      send: (payload, validateOnly) =>
        opts.client.request({ type: "op", op: "clone", run_id: runId, ...payload, validate_only: validateOnly }),
      isOpen: () => serial === editorSerial,
    });
    function scheduleCheck(): void {
      // An edit may fix what the server refused; parse errors gate Create at once.
      serverError = false;
      collect();
      if (checkTimer !== undefined) clearTimeout(checkTimer);
      checkTimer = setTimeout(() => void check(), 400);
    }

    /** validate_only: Python builds the real configs and creates nothing. */
    async function check(): Promise<void> {
      const { changes, ok } = collect();
      if (ok && Object.keys(changes).length === 0) {
        status.className = "rf-note";
        status.textContent = "no changes yet: edit a knob (a clone with no changes repeats its parent)";
      }
      const outcome = await submitter.check();
      if (outcome.kind === "stale") return;
      if (outcome.kind === "parse-error") {
        status.className = "rf-error";
        status.textContent = "fix the marked fields";
        return;
      }
      if (outcome.kind === "refused") {
        serverError = true;
        gate(false);
        showServerError(outcome.error);
        return;
      }
      serverError = false;
      gate(true);
      const now = collect().changes;
      if (Object.keys(now).length > 0) {
        status.className = "rf-ok";
        status.textContent = `valid: ${Object.entries(now).map(([k, v]) => `${k}=${formatKnobValue(v)}`).join(", ")}`;
      }
    }

    create.addEventListener("click", async () => {
      // The click creates from what the form holds now; a debounced check still pending or in
      // flight is dropped (the submit validates in Python before creating).
      if (checkTimer !== undefined) clearTimeout(checkTimer);
      checkTimer = undefined;
      create.disabled = true;
      status.className = "rf-note";
      status.textContent = "creating the clone…";
      let outcome: Awaited<ReturnType<CloneSubmitter["submit"]>> = { kind: "closed" };
      try {
        outcome = await submitter.submit();
        if (outcome.kind === "closed") return;
        if (outcome.kind === "parse-error") {
          status.className = "rf-error";
          status.textContent = "fix the marked fields first";
          return;
        }
        if (outcome.kind === "refused") {
          serverError = true;
          showServerError(outcome.error);
          return;
        }
        opts.say(`cloned run ${runId} as run ${String(outcome.newRunId)}`, "ok");
        close();
        opts.requestPull();
      } finally {
        if (outcome.kind !== "created" && outcome.kind !== "closed") gate(!serverError && collect().ok);
      }
    });
  }

  return { el, open };
}
