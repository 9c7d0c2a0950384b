// Bundles src/index.ts (and plotly.js-basic) into one ESM file, rapidfire_nb/static/panel.js,
// which the Python Panel widget serves as its anywidget `_esm`. Run by `npm run build`, and by
// hatch-jupyter-builder during the wheel build.
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outfile = path.resolve(here, "..", "rapidfire_nb", "static", "panel.js");
const watch = process.argv.includes("--watch");

const options = {
  entryPoints: [path.join(here, "src", "index.ts")],
  bundle: true,
  format: "esm",
  // ES2020 keeps the bundle loadable by the Chromium/Electron versions of VS Code and Colab.
  target: ["es2020"],
  minify: !watch,
  sourcemap: false,
  outfile,
  legalComments: "eof",
  logLevel: "info",
};

if (watch) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else {
  await esbuild.build(options);
}
