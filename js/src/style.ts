/**
 * The panel's CSS, scoped under `.rf-panel`. Colours fall back through JupyterLab's and VS Code's
 * theme variables so the panel reads well in light and dark themes of every front-end.
 */
export const CSS = `
.rf-panel {
  --rf-fg: var(--jp-ui-font-color1, var(--vscode-editor-foreground, #1f2328));
  --rf-fg2: var(--jp-ui-font-color2, var(--vscode-descriptionForeground, #59636e));
  --rf-bg: var(--jp-layout-color1, var(--vscode-editor-background, #ffffff));
  --rf-bg2: var(--jp-layout-color2, var(--vscode-editorWidget-background, #f3f4f6));
  --rf-border: var(--jp-border-color2, var(--vscode-panel-border, #d0d7de));
  --rf-accent: var(--jp-brand-color1, var(--vscode-focusBorder, #0b61a4));
  --rf-error: var(--jp-error-color1, #c62828);
  color: var(--rf-fg);
  font-family: var(--jp-ui-font-family, -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif);
  font-size: 13px;
  line-height: 1.4;
  box-sizing: border-box;
  max-width: 100%;
  padding: 6px 2px;
}
.rf-panel * { box-sizing: border-box; }
.rf-header { display: flex; align-items: baseline; gap: 12px; flex-wrap: wrap; margin-bottom: 6px; }
.rf-title { font-weight: 600; font-size: 14px; }
.rf-counts { display: flex; gap: 6px; flex-wrap: wrap; }
.rf-count { padding: 0 6px; border-radius: 8px; color: #fff; font-size: 11px; }
.rf-live { margin-left: auto; color: var(--rf-fg2); font-size: 11px; }
.rf-live.rf-read-only { color: var(--rf-fg); font-weight: 600; border: 1px solid var(--rf-border); border-radius: 8px; padding: 0 6px; }
.rf-charts { display: flex; gap: 8px; flex-wrap: wrap; }
.rf-chart { flex: 1 1 360px; min-width: 300px; border: 1px solid var(--rf-border); border-radius: 4px; padding: 4px; }
.rf-chart-head { display: flex; gap: 6px; align-items: center; font-size: 12px; color: var(--rf-fg2); }
.rf-chart-body { position: relative; }
.rf-chart-plot { width: 100%; height: 260px; position: relative; cursor: crosshair; user-select: none; }
.rf-chart-plot > canvas { position: absolute; left: 0; top: 0; }
.rf-tip {
  position: absolute; z-index: 2; pointer-events: none; padding: 2px 6px; font-size: 11px; line-height: 1.35;
  white-space: nowrap; color: var(--rf-fg); background: var(--rf-bg); border: 2px solid; border-radius: 3px;
  box-shadow: 0 1px 3px rgba(0,0,0,0.25);
}
/* A pruner's reason can be hundreds of characters: it wraps inside the chart. */
.rf-tip.rf-tip-wrap { white-space: normal; max-width: min(360px, 90%); overflow-wrap: anywhere; }
.rf-tip.rf-tip-multi { max-width: min(420px, 95%); overflow: hidden; }
.rf-tip-head { color: var(--rf-fg2); }
.rf-tip-row { display: flex; gap: 6px; }
.rf-tip-row.rf-tip-hit { font-weight: 600; }
.rf-tip-name { overflow: hidden; text-overflow: ellipsis; flex: 1 1 auto; }
.rf-tip-value { font-variant-numeric: tabular-nums; margin-left: auto; }
.rf-tip-smoothed { color: var(--rf-fg2); font-variant-numeric: tabular-nums; }
.rf-tip-full { color: var(--rf-fg2); max-width: 400px; overflow: hidden; text-overflow: ellipsis; }
.rf-tip-more { color: var(--rf-fg2); }
.rf-curvebar { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; font-size: 12px; color: var(--rf-fg2); margin: 2px 0 4px; }
.rf-curvebar label { display: inline-flex; gap: 4px; align-items: center; }
.rf-curvebar input[type=range] { width: 110px; }
.rf-curve-note { flex-basis: 100%; font-size: 11px; }
.rf-legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: 11px; margin: 4px 0; max-height: 66px; overflow-y: auto; }
.rf-legend-item { display: inline-flex; gap: 4px; align-items: center; cursor: pointer; white-space: nowrap; }
.rf-legend-item.rf-legend-hidden { opacity: 0.4; text-decoration: line-through; }
.rf-legend-swatch { display: inline-block; width: 14px; height: 3px; border-radius: 1px; }
.rf-time-res { color: var(--rf-fg2); font-size: 10px; white-space: nowrap; margin-left: 6px; min-width: 9em; }
.rf-notebox { display: flex; gap: 6px; align-items: center; font-size: 12px; margin: 2px 0 6px; }
.rf-notebox input { flex: 1 1 auto; min-width: 120px; }
.rf-legend-note { color: var(--rf-fg2); }
.rf-knob-body { position: relative; }
.rf-knob-canvas { display: block; cursor: pointer; }
.rf-knob-note { color: var(--rf-fg2); font-size: 11px; }
.rf-knob-tip { white-space: nowrap; }
/* Generations side by side: cells wrap (a completion is a sentence, not a number) and stay short;
   the prompt column stays at the left edge when the table scrolls sideways. */
.rf-gen-wrap { overflow: auto; max-height: 420px; margin-top: 4px; }
.rf-gen-table { width: auto; min-width: 100%; }
.rf-gen-table th, .rf-gen-table td { white-space: normal; min-width: 12em; max-width: 28em; }
/* Top, not the bottom the run table's headers sit at: a column without a "from N samples" line
   would put its run's name level with the other columns' "from" lines, reading as one more of them. */
.rf-table.rf-gen-table th, .rf-table.rf-gen-table td { vertical-align: top; }
.rf-gen-table th[data-run-id] { cursor: pointer; }
.rf-gen-table td.rf-gen-prompt, .rf-gen-table th.rf-gen-prompt { position: sticky; left: 0; background: var(--rf-bg2); z-index: 1; }
.rf-gen-table thead th.rf-gen-prompt { z-index: 2; }
.rf-gen-text { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 9em; overflow-y: auto; }
.rf-gen-ref { color: var(--rf-fg2); font-size: 11px; white-space: pre-wrap; overflow-wrap: anywhere; margin-top: 2px; }
.rf-gen-ref-key { font-style: italic; }
.rf-gen-exact { color: #1a7f37; }
.rf-gen-mark { font-weight: 700; }
.rf-gen-extra { text-decoration: underline wavy #b58900; text-decoration-thickness: 1px; }
.rf-gen-none { color: var(--rf-fg2); }
.rf-gen-empty { color: var(--rf-fg2); font-style: italic; }
.rf-gen-legend { color: var(--rf-fg2); font-size: 11px; margin-top: 4px; }
.rf-gen-from { color: var(--rf-fg2); font-weight: 400; font-size: 10px; }
.rf-gen-table .rf-gen-pinned { box-shadow: inset 2px 0 0 var(--rf-accent), inset -2px 0 0 var(--rf-accent); }
.rf-gen-label { font-variant-numeric: tabular-nums; }
.rf-curvebar input.rf-gen-slider { width: 220px; }
.rf-chart-plot > canvas:focus { outline: none; }
.rf-chart-plot > canvas:focus-visible { outline: 2px solid var(--rf-fg2); outline-offset: -2px; }
.rf-zoombox { position: absolute; pointer-events: none; background: rgba(128,128,128,0.18); border: 1px dashed var(--rf-fg2); }
.rf-chart-waiting {
  position: absolute; inset: 0; display: flex; align-items: center; justify-content: center;
  padding: 0 24px; text-align: center; color: var(--rf-fg2); font-size: 12px; pointer-events: none;
}
.rf-panel select, .rf-panel input[type=text] {
  font: inherit; color: var(--rf-fg); background: var(--rf-bg);
  border: 1px solid var(--rf-border); border-radius: 3px; padding: 1px 4px;
}
/* At 48 runs the table scrolls inside its own box (header kept in view), so the charts above and
   the top runs of the sort stay on screen together. */
.rf-table-wrap { overflow: auto; margin-top: 4px; max-height: 460px; }
.rf-table thead th { position: sticky; top: 0; z-index: 1; }
.rf-table th.rf-sortable { cursor: pointer; }
.rf-table th[data-sorted=asc]::after { content: "\\00a0▲"; font-size: 9px; white-space: nowrap; }
.rf-table th[data-sorted=desc]::after { content: "\\00a0▼"; font-size: 9px; white-space: nowrap; }
.rf-table tbody tr:hover, .rf-table tbody tr.rf-hot { background: var(--rf-bg2); }
.rf-table tbody tr.rf-pinned { outline: 2px solid var(--rf-accent); outline-offset: -2px; }
/* The run id stays at the left edge when the table scrolls sideways: a row must still say whose it is. */
.rf-table td.rf-id { position: sticky; left: 0; background: var(--rf-bg); }
.rf-table thead th:first-child { left: 0; z-index: 2; }
.rf-table tbody tr:hover td.rf-id, .rf-table tbody tr.rf-hot td.rf-id { background: var(--rf-bg2); }
.rf-group-row td { cursor: pointer; color: var(--rf-fg2); font-style: italic; }
.rf-filters { display: flex; gap: 10px; align-items: center; margin-top: 6px; font-size: 11px; color: var(--rf-fg2); }
.rf-filters label { display: inline-flex; gap: 3px; align-items: center; cursor: pointer; }
.rf-table { border-collapse: collapse; width: 100%; font-size: 12px; }
.rf-table th, .rf-table td { padding: 2px 4px; border-bottom: 1px solid var(--rf-border); text-align: left; white-space: nowrap; }
.rf-table th { color: var(--rf-fg2); font-weight: 600; background: var(--rf-bg2); white-space: normal; vertical-align: bottom; }
.rf-clip { display: inline-block; max-width: 7.5em; overflow: hidden; text-overflow: ellipsis; vertical-align: bottom; }
.rf-table td.rf-num { text-align: right; font-variant-numeric: tabular-nums; }
.rf-swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; border: 2px solid; cursor: pointer; }
.rf-swatch.rf-swatch-off { background: transparent !important; }
.rf-status { padding: 0 6px; border-radius: 8px; color: #fff; font-size: 11px; }
.rf-progress { display: inline-block; width: 32px; height: 6px; background: var(--rf-bg2); border: 1px solid var(--rf-border); border-radius: 3px; vertical-align: middle; margin-right: 6px; overflow: hidden; }
.rf-progress > span { display: block; height: 100%; background: var(--rf-accent); }
.rf-actions { display: flex; gap: 2px; }
.rf-panel button {
  font: inherit; font-size: 11px; padding: 1px 4px; cursor: pointer;
  color: var(--rf-fg); background: var(--rf-bg2); border: 1px solid var(--rf-border); border-radius: 3px;
}
.rf-panel button:disabled { opacity: 0.4; cursor: default; }
.rf-panel button.rf-primary { background: var(--rf-accent); color: #fff; border-color: var(--rf-accent); }
.rf-panel button.rf-danger { color: var(--rf-error); }
.rf-note { color: var(--rf-fg2); font-size: 11px; }
.rf-suggest { margin-top: 3px; padding: 2px 4px; border-left: 3px solid #b58900; font-size: 11px; display: flex; flex-wrap: wrap; gap: 4px; align-items: center; }
.rf-suggest-label { color: #b58900; font-weight: 600; }
.rf-suggest-text { color: var(--rf-fg2); max-width: 22em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.rf-count-suggest { background: #b58900; }
.rf-row-note { max-width: 320px; overflow: hidden; display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical; white-space: normal; overflow-wrap: anywhere; }
.rf-more-cols { margin-left: auto; }
.rf-box { border: 1px solid var(--rf-border); border-radius: 4px; padding: 6px 8px; margin-top: 8px; background: var(--rf-bg); }
.rf-box h4 { margin: 0 0 6px 0; font-size: 13px; }
.rf-form { display: grid; grid-template-columns: max-content minmax(120px, 320px) 1fr; gap: 3px 8px; align-items: center; }
.rf-form label { font-size: 12px; }
.rf-more { margin-top: 4px; }
.rf-more > .rf-form { margin-top: 4px; }
.rf-form input.rf-invalid { border-color: var(--rf-error); }
.rf-form input.rf-changed { border-color: var(--rf-accent); }
.rf-field-error { color: var(--rf-error); font-size: 11px; }
.rf-error { color: var(--rf-error); white-space: pre-wrap; }
.rf-worker-notices { margin: 4px 0; font-size: 12px; }
/* Ray workers: the notices' dismiss button and the chunk timeline */
.rf-notice { display: flex; gap: 6px; align-items: baseline; }
.rf-panel button.rf-notice-close { padding: 0 5px; line-height: 1.2; color: var(--rf-fg2); background: transparent; border-color: transparent; }
.rf-panel button.rf-notice-close:hover { border-color: var(--rf-border); color: var(--rf-fg); }
.rf-panel button.rf-notice-show { border: none; background: none; padding: 0; color: var(--rf-fg2); text-decoration: underline; cursor: pointer; font: inherit; }
.rf-timeline { position: relative; width: 100%; margin-top: 4px; }
.rf-timeline-canvas { display: block; }
.rf-timeline-tip {
  position: absolute; z-index: 2; max-width: 420px; padding: 3px 6px; font-size: 11px; pointer-events: none;
  color: var(--rf-fg); background: var(--rf-bg); border: 1px solid var(--rf-border); border-radius: 3px;
  box-shadow: 0 1px 4px rgba(0, 0, 0, 0.15);
}
.rf-ok { color: #1a7f37; }
.rf-buttons { display: flex; gap: 6px; margin-top: 6px; align-items: center; }
.rf-traceback { max-height: 320px; overflow: auto; font-size: 11px; background: var(--rf-bg2); padding: 6px; margin: 0; white-space: pre; }
.rf-time-plot { width: 100%; padding: 4px 0; }
.rf-time-legend { display: flex; gap: 12px; font-size: 10px; color: var(--rf-fg2); margin-bottom: 4px; }
.rf-time-key { display: inline-block; width: 10px; height: 10px; margin-right: 3px; vertical-align: -1px; border-radius: 2px; }
.rf-time-row { display: flex; align-items: center; gap: 6px; }
.rf-time-label { flex: 0 0 70px; text-align: right; white-space: nowrap; overflow: hidden; color: var(--rf-fg2); }
.rf-time-track { flex: 1 1 auto; height: 70%; min-width: 0; }
.rf-time-fill { display: flex; height: 100%; min-width: 1px; }
.rf-time-fill > span { display: block; height: 100%; }
.rf-time-total { flex: 0 0 56px; color: var(--rf-fg2); font-variant-numeric: tabular-nums; white-space: nowrap; }
.rf-messages { margin-top: 4px; font-size: 11px; min-height: 1em; }
.rf-panel details > summary { cursor: pointer; color: var(--rf-fg2); margin-top: 8px; }
.rf-banner { margin: 4px 0; padding: 4px 8px; border: 1px solid var(--rf-error); border-radius: 4px; color: var(--rf-error); font-size: 12px; font-weight: 600; }
.rf-panel.rf-disconnected .rf-charts, .rf-panel.rf-disconnected .rf-table-wrap, .rf-panel.rf-disconnected .rf-filters, .rf-panel.rf-disconnected .rf-counts,
.rf-panel.rf-disconnected .rf-time-plot, .rf-panel.rf-disconnected .rf-timeline { opacity: 0.45; filter: grayscale(1); }
.rf-panel.rf-disconnected .rf-live { color: var(--rf-error); font-weight: 600; }
.rf-status.rf-queued { font-style: italic; }
.rf-on-device { font-size: 10px; color: var(--rf-fg2); white-space: nowrap; }
.rf-clip.rf-default { color: var(--rf-fg2); font-style: italic; }
`;
