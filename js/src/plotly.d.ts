// The few Plotly functions the panel uses; plotly.js-basic-dist-min ships no types.
declare module "plotly.js-basic-dist-min" {
  type Data = Record<string, unknown>;
  type Layout = Record<string, unknown>;
  type Config = Record<string, unknown>;
  const Plotly: {
    newPlot(el: HTMLElement, data: Data[], layout?: Layout, config?: Config): Promise<unknown>;
    react(el: HTMLElement, data: Data[], layout?: Layout, config?: Config): Promise<unknown>;
    extendTraces(el: HTMLElement, update: { x: number[][]; y: number[][] }, indices: number[]): Promise<unknown>;
    addTraces(el: HTMLElement, traces: Data | Data[], newIndices?: number[]): Promise<unknown>;
    restyle(el: HTMLElement, update: Record<string, unknown>, indices?: number[]): Promise<unknown>;
    relayout(el: HTMLElement, update: Record<string, unknown>): Promise<unknown>;
    purge(el: HTMLElement): void;
    Plots: { resize(el: HTMLElement): Promise<unknown> | void };
  };
  export default Plotly;
}
