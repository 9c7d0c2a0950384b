/**
 * Axis ticks shared by the curve charts and the chunk timeline: round steps (1, 2 or 5 times a
 * power of ten), their labels, and log-scale ticks. Pure, so vitest checks them.
 */

/** A tick step of 1, 2 or 5 times a power of ten giving at most `maxTicks` ticks over `span`. */
export function niceStep(span: number, maxTicks: number): number {
  if (!(span > 0) || !Number.isFinite(span)) return 1;
  const raw = span / Math.max(1, maxTicks);
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

/** The multiples of a nice step inside [min, max]. */
export function niceTicks(min: number, max: number, maxTicks: number): { ticks: number[]; step: number } {
  const step = niceStep(max - min, maxTicks);
  const ticks: number[] = [];
  const first = Math.ceil(min / step - 1e-9);
  for (let k = first; k * step <= max + step * 1e-9 && ticks.length < 1000; k++) {
    // Rounded to the step's decimals: 0.1 * 3 is 0.30000000000000004.
    ticks.push(Number((k * step).toPrecision(12)));
  }
  return { ticks, step };
}

/**
 * A tick label: thousands as "20k" (x is samples seen, often tens of thousands), millions as "2M",
 * past 1e9 exponential; otherwise as many decimals as the step needs, so two ticks never read the
 * same (a near-flat metric, ln 2 give or take 1e-7, gets "0.69314710 0.69314715").
 */
export function fmtTick(v: number, step: number): string {
  if (v === 0) return "0";
  const abs = Math.abs(v);
  // The digits that tell two ticks apart: from the value's leading digit down to the step's.
  // (Trailing zeros dropped: "1e+30" beside "8e+29", not "1.0e+30".)
  const exp = () => v.toExponential(Math.max(0, Math.min(15, Math.floor(Math.log10(abs)) - Math.floor(Math.log10(step) + 1e-9))))
    .replace(/\.?0+e/, "e");
  if (abs >= 1e9) return exp();
  // By the step, not the value, so one axis reads "4k 6k 8k 10k" rather than "4000 6000 8000 10k".
  if (abs >= 1e6 && step >= 1e5) return `${Number((v / 1e6).toPrecision(6))}M`;
  if (step >= 1e3) return `${Number((v / 1e3).toPrecision(6))}k`;
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
  if (abs < 1e-4 || decimals > 12) return exp();
  return v.toFixed(decimals);
}

/** A power of ten as a label: "0.01", "1", "1000" near one, "1e-5", "1e+6" farther out. */
function fmtPow(k: number): string {
  return k >= -3 && k <= 4 ? String(Number((10 ** k).toPrecision(6))) : `1e${k > 0 ? "+" : ""}${k}`;
}

/** Up to this many 1-2-5 ticks are kept on a log axis even past `maxTicks`: two powers alone cannot be read. */
export const MAX_LOG_125 = 9;

/**
 * Ticks of a log-scale axis whose range is [lo, hi] in log10 units: positions (log10 of the
 * value) and labels of the values. Over a decade or more: 1, 2 and 5 times the powers of ten
 * while there are at most `maxTicks` of them, or MAX_LOG_125 (an eval loss from 0.5 to 12
 * read "1, 10" and nothing between), else powers of ten, every k-th one
 * when there are too many; inside one decade: round values of the linear scale, placed at
 * their logarithm.
 */
export function logTicks(lo: number, hi: number, maxTicks: number): { at: number[]; labels: string[] } {
  const at: number[] = [];
  const labels: string[] = [];
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || hi <= lo) return { at, labels };
  const n = Math.max(2, maxTicks);
  if (hi - lo < 1) {
    const a = 10 ** lo;
    const b = 10 ** hi;
    const { ticks, step } = niceTicks(a, b, n);
    for (const t of ticks) {
      if (t <= 0) continue;
      at.push(Math.log10(t));
      labels.push(fmtTick(t, step));
    }
    return { at, labels };
  }
  const first = Math.ceil(lo - 1e-9);
  const last = Math.floor(hi + 1e-9);
  const decades = last - first + 1;
  const every = Math.max(1, Math.ceil(decades / n));
  // The 1-2-5 ticks inside the range, counted exactly (the ends of the range cut decades short).
  let oneTwoFive = 0;
  for (let k = first - 1; k <= last; k++) for (const m of [1, 2, 5]) { const p = k + Math.log10(m); if (p >= lo - 1e-9 && p <= hi + 1e-9) oneTwoFive++; }
  // Three decades of 1-2-5 (nine labels) still read on a chart a few hundred pixels high.
  const between = oneTwoFive <= Math.max(n, MAX_LOG_125) ? [2, 5] : [];
  for (let k = first - 1; k <= last; k++) {
    if (k >= first && (k - first) % every === 0) {
      at.push(k);
      labels.push(fmtPow(k));
    }
    for (const m of between) {
      const p = k + Math.log10(m);
      if (p >= lo && p <= hi) {
        at.push(p);
        // the powers' notation: "5e-5" beside "1e-4", "0.005" beside "0.001"
        labels.push(k >= -3 && k <= 4 ? String(Number((m * 10 ** k).toPrecision(6))) : `${m}e${k > 0 ? "+" : ""}${k}`);
      }
    }
  }
  const order = at.map((_, i) => i).sort((i, j) => at[i] - at[j]);
  return { at: order.map((i) => at[i]), labels: order.map((i) => labels[i]) };
}
