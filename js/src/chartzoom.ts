/**
 * A curve chart's drag to zoom, Plotly-style: the drag starts inside the plot, a box shows what
 * a release would zoom to, and the release gives the ranges selected.
 */
import { clampToBox, dragZoom, type PlotBox, type Range, type Scales } from "./chartgeometry";

export class ZoomDrag {
  private start: { x: number; y: number } | null = null;

  /** `box` is the element that shows the selection while the drag lasts. */
  constructor(private readonly box: HTMLDivElement) {}

  /** A drag is under way (the hover waits for its end). */
  get active(): boolean {
    return this.start !== null;
  }

  /** Start a drag at canvas point (x, y): one on the tick labels starts at the plot's edge. */
  begin(plot: PlotBox, x: number, y: number): void {
    this.start = clampToBox(plot, x, y);
  }

  /** The pointer moved to (x, y) while dragging: show what a release would zoom to. */
  track(plot: PlotBox, x: number, y: number): void {
    if (this.start === null) return;
    const b = plot;
    const { x: cx, y: cy } = clampToBox(b, x, y);
    const dx = Math.abs(cx - this.start.x);
    const dy = Math.abs(cy - this.start.y);
    // The box shows what a release would zoom to: a full-height band for an x-only drag.
    const xOnly = dy < 8;
    const yOnly = dx < 8 && !xOnly;
    const left = yOnly ? b.left : Math.min(cx, this.start.x);
    const top = xOnly ? b.top : Math.min(cy, this.start.y);
    Object.assign(this.box.style, {
      display: dx < 5 && dy < 5 ? "none" : "",
      left: `${left}px`, top: `${top}px`,
      width: `${yOnly ? b.width : dx}px`, height: `${xOnly ? b.height : dy}px`,
    });
  }

  /**
   * End the drag where the pointer is (`at`, read only when the chart still has scales); the
   * ranges it selects, or null for none (a click, or no plot any more).
   */
  finish(scales: Scales | null, at: () => [number, number]): { x: Range | null; y: Range | null } | null {
    const start = this.start;
    if (start === null) return null;
    this.start = null;
    this.box.style.display = "none";
    if (scales === null) return null;
    const [x, y] = at();
    const end = clampToBox(scales.box, x, y);
    return dragZoom(scales, start.x, start.y, end.x, end.y);
  }
}
