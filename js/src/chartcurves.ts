/**
 * A curve chart's data on the canvas: each run's line (the raw one faint behind a smoothed one),
 * its point markers, and the pruning rungs' crosses.
 */
import { dashArray, isolatedPoints, rungAxisY, toPx, type DrawSeries, type RungMark, type Scales } from "./chartgeometry";

/** What one curve's last draw put on the canvas: point count and summed pixel y, per path. */
export interface PathRecord {
  runId: number;
  raw: { n: number; ySum: number; alpha: number };
  smooth: { n: number; ySum: number; alpha: number } | null;
}

/** Clip what follows to the plot, a little wider so that markers at the edges show whole. */
export function clipToPlot(ctx: CanvasRenderingContext2D, scales: Scales): void {
  const { box } = scales;
  ctx.beginPath();
  ctx.rect(box.left - 3, box.top - 3, box.width + 6, box.height + 6);
  ctx.clip();
}

/**
 * Draw every shown series, the focused ones last (on top). `series` are in axis units, `mainY`
 * is the line each draws on top, `smoothW` its smoothing weight (above 0: the raw line is drawn
 * faint behind it). What each curve drew, in draw order.
 */
export function drawCurves(
  ctx: CanvasRenderingContext2D, series: readonly DrawSeries[], mainY: readonly (number | null)[][],
  smoothW: readonly number[], scales: Scales,
): PathRecord[] {
  const paths: PathRecord[] = [];
  const order = [...series.keys()].sort((a, b) => Number(series[a].focused) - Number(series[b].focused));
  const { x: xr, y: yr, box } = scales;
  const kx = box.width / (xr[1] - xr[0]);
  const ky = box.height / (yr[1] - yr[0]);
  const bottom = box.top + box.height;
  ctx.lineJoin = "round";
  const line = (xs: readonly number[], ys: readonly (number | null)[]): { n: number; ySum: number } => {
    ctx.beginPath();
    let pen = false;
    let n = 0;
    let ySum = 0;
    for (let i = 0; i < xs.length; i++) {
      const y = ys[i];
      if (y === null || !Number.isFinite(y)) {
        pen = false;
        continue;
      }
      const px = box.left + (xs[i] - xr[0]) * kx;
      const py = bottom - (y - yr[0]) * ky;
      if (pen) ctx.lineTo(px, py);
      else ctx.moveTo(px, py);
      pen = true;
      n++;
      ySum += py;
    }
    ctx.stroke();
    return { n, ySum };
  };
  for (const si of order) {
    const s = series[si];
    if (!s.shown || s.x.length === 0) continue;
    const main = mainY[si];
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    const record: PathRecord = { runId: s.runId, raw: { n: 0, ySum: 0, alpha: s.opacity }, smooth: null };
    const smoothOn = smoothW[si] > 0;
    if (smoothOn) {
      // The raw curve, thin and faint behind the smoothed one, as TensorBoard draws it.
      const alpha = s.opacity * 0.25;
      ctx.globalAlpha = alpha;
      ctx.lineWidth = 1;
      ctx.setLineDash([]);
      record.raw = { ...line(s.x, s.y), alpha };
    }
    ctx.globalAlpha = s.opacity;
    ctx.lineWidth = s.width;
    ctx.setLineDash(dashArray(s.dash, s.width));
    const drawn = line(s.x, main);
    if (smoothOn) record.smooth = { ...drawn, alpha: s.opacity };
    else record.raw = { ...drawn, alpha: s.opacity };
    paths.push(record);
    const dots = s.markers ? null : isolatedPoints(main);
    if (s.markers || dots!.length) {
      ctx.setLineDash([]);
      ctx.beginPath();
      const r = s.markers ? 2 : Math.max(1.5, s.width);
      for (const i of dots ?? s.x.keys()) {
        const y = main[i];
        if (y === null || !Number.isFinite(y)) continue;
        const px = box.left + (s.x[i] - xr[0]) * kx;
        const py = bottom - (y - yr[0]) * ky;
        ctx.moveTo(px + r, py);
        ctx.arc(px, py, r, 0, 2 * Math.PI);
      }
      ctx.fill();
    }
  }
  return paths;
}

/** A cross where the pruner cut each run, in its run's colour. */
export function drawRungs(
  ctx: CanvasRenderingContext2D, rungs: readonly RungMark[], scales: Scales, logY: boolean, family: string,
): void {
  ctx.globalAlpha = 1;
  ctx.setLineDash([]);
  ctx.font = `14px ${family}`;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  for (const r of rungs) {
    const ry = rungAxisY(r.y, logY);
    if (ry === null) continue;
    const [px, py] = toPx(scales, r.x, ry);
    ctx.fillStyle = r.color;
    ctx.fillText("\u2715", px, py);
  }
}
