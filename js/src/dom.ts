/** The one DOM helper the panel's views share: an element with attributes and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  children: (Node | string)[] = [],
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v);
  }
  for (const c of children) el.append(c);
  return el;
}

/** A box shown on demand below the table (the clone editor, a run's traceback). */
export function hiddenBox(testid: string): HTMLDivElement {
  const box = h("div", { class: "rf-box", "data-testid": testid });
  box.style.display = "none";
  return box;
}

/** Hide a box and drop what it showed. */
export function closeBox(box: HTMLElement): void {
  box.style.display = "none";
  box.replaceChildren();
}
