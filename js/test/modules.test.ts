// How the panel's modules depend on each other: the fold (src/state.ts) imports no other module
// of the panel, the logic it feeds (table, chart planning, text, colours) stays free of the DOM
// views, and no two modules import each other, directly or round a loop.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const SRC = join(dirname(fileURLToPath(import.meta.url)), "..", "src");
const MODULES = readdirSync(SRC).filter((f) => f.endsWith(".ts")).map((f) => f.slice(0, -".ts".length)).sort();

/** The panel modules a module imports (`import ... from "./x"`, types included). */
function localImports(name: string): string[] {
  const text = readFileSync(join(SRC, `${name}.ts`), "utf8");
  return [...text.matchAll(/^import[^;]*?from "\.\/([\w-]+)";/gms)].map((m) => m[1]);
}

describe("panel module imports", () => {
  const graph = new Map(MODULES.map((m) => [m, localImports(m)]));

  it("reads the imports (a parser that finds none checks nothing)", () => {
    expect(graph.get("index")).toEqual(expect.arrayContaining(["state", "table", "chartplan", "tableview", "timesplit"]));
    expect(graph.get("tableview")).toEqual(expect.arrayContaining(["state", "table", "tablerow", "dom"]));
    expect(graph.get("tablerow")).toEqual(expect.arrayContaining(["state", "table", "format", "dom"]));
    for (const deps of graph.values()) for (const d of deps) expect(MODULES).toContain(d);
  });

  it("state.ts, the fold, imports no other panel module", () => {
    expect(graph.get("state")).toEqual([]);
  });

  it("the derived logic imports no view and no DOM helper", () => {
    const views = ["index", "timeline", "canvaschart", "chartaxes", "chartcurves", "charthover", "chartzoom", "workers",
      "tableview", "tablehead", "tablerow", "tableops", "tablefilters", "cloneview", "tracebackview", "timesplit",
      "generationsview", "dom"];
    for (const m of ["table", "chartplan", "format", "palette", "generations"]) {
      expect([m, graph.get(m)!.filter((d) => views.includes(d))]).toEqual([m, []]);
    }
  });

  it("only index.ts wires the views: no view imports index or another view factory", () => {
    const factories = ["index", "tableview", "cloneview", "tracebackview", "timesplit", "timeline", "generationsview"];
    for (const m of MODULES.filter((x) => x !== "index")) {
      expect([m, graph.get(m)!.filter((d) => factories.includes(d))]).toEqual([m, []]);
    }
  });

  it("has no import cycle", () => {
    const cycles: string[] = [];
    const walk = (m: string, path: string[]) => {
      if (path.includes(m)) {
        cycles.push([...path.slice(path.indexOf(m)), m].join(" -> "));
        return;
      }
      for (const d of graph.get(m) ?? []) walk(d, [...path, m]);
    };
    for (const m of MODULES) walk(m, []);
    expect(cycles).toEqual([]);
  });
});
