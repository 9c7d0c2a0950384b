/**
 * A curve chart's frame: where the plot sits in the canvas (the y tick labels' width sets its left
 * edge), the grid, the tick labels and the axis names.
 */
import { toPx, type PlotBox, type Range, type Scales } from "./chartgeometry";
import { fmtTick, logTicks, niceTicks } from "./ticks";

export const FONT_PX = 11;
const MARGIN = { right: 10, top: 8, bottom: 34 };

/** The plot's place and scales, and the ticks of both axes (y in axis units, with their labels). */
export interface PlotLayout {
  scales: Scales;
  yTicks: number[];
  yText: string[];
  xTicks: { ticks: number[]; step: number };
}

/** Lay out a canvas of `width` x `height` CSS pixels for these data ranges, in the theme's font. */
export function layoutPlot(
  ctx: CanvasRenderingContext2D, ext: { x: Range; y: Range }, logY: boolean, width: number, height: number, family: string,
): PlotLayout {
  // Tick labels are measured in the font they are drawn in.
  ctx.font = `${FONT_PX}px ${family}`;
  const maxY = Math.max(2, Math.floor(height / 40));
  const lin = logY ? null : niceTicks(ext.y[0], ext.y[1], maxY);
  const lg = logY ? logTicks(ext.y[0], ext.y[1], maxY) : null;
  const yTicks = lin ? lin.ticks : lg!.at;
  const yText = lin ? lin.ticks.map((t) => fmtTick(t, lin.step)) : lg!.labels;
  const labelW = Math.max(0, ...yText.map((t) => ctx.measureText(t).width));
  const box: PlotBox = {
    left: Math.ceil(labelW + 6 + FONT_PX + 8),
    top: MARGIN.top,
    width: Math.max(10, width - Math.ceil(labelW + 6 + FONT_PX + 8) - MARGIN.right),
    height: Math.max(10, height - MARGIN.top - MARGIN.bottom),
  };
  const xTicks = niceTicks(ext.x[0], ext.x[1], Math.max(2, Math.floor(box.width / 70)));
  return { scales: { x: ext.x, y: ext.y, box }, yTicks, yText, xTicks };
}

/** What the axes are labelled with, beside the layout. */
export interface AxisText {
  /** The text colour. */
  fg: string;
  xLabel: string;
  yLabel: string;
  /** The canvas's width: the last x label stays whole inside it. */
  width: number;
}

/** Draw the grid, the tick labels and the axis names; the tick labels as written, per axis. */
export function drawAxes(ctx: CanvasRenderingContext2D, layout: PlotLayout, text: AxisText): { x: string[]; y: string[] } {
  const { scales, yTicks, yText, xTicks } = layout;
  const { box } = scales;
  const [x0] = scales.x;
  const [y0] = scales.y;
  ctx.lineWidth = 1;
  ctx.strokeStyle = "rgba(128,128,128,0.25)";
  ctx.setLineDash([]);
  ctx.globalAlpha = 1;
  ctx.beginPath();
  for (const t of yTicks) {
    const py = Math.round(toPx(scales, x0, t)[1]) + 0.5;
    ctx.moveTo(box.left, py);
    ctx.lineTo(box.left + box.width, py);
  }
  for (const t of xTicks.ticks) {
    const px = Math.round(toPx(scales, t, y0)[0]) + 0.5;
    ctx.moveTo(px, box.top);
    ctx.lineTo(px, box.top + box.height);
  }
  ctx.stroke();
  ctx.fillStyle = text.fg;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  yTicks.forEach((t, i) => ctx.fillText(yText[i], box.left - 4, toPx(scales, x0, t)[1]));
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const written = { x: [] as string[], y: yText };
  for (const t of xTicks.ticks) {
    // The last label of a zoomed axis can sit at the right edge: keep it whole inside the canvas.
    const label = fmtTick(t, xTicks.step);
    written.x.push(label);
    const half = ctx.measureText(label).width / 2;
    const px = Math.min(text.width - half - 1, Math.max(half + 1, toPx(scales, t, y0)[0]));
    ctx.fillText(label, px, box.top + box.height + 4);
  }
  ctx.fillText(text.xLabel, box.left + box.width / 2, box.top + box.height + 6 + FONT_PX + 2);
  ctx.save();
  ctx.translate(2 + FONT_PX / 2, box.top + box.height / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(text.yLabel, 0, 0);
  ctx.restore();
  return written;
}
