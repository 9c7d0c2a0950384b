// Bundles src/index.ts (and its imports) into one ESM file, rapidfire_nb/static/panel.js,
// which the Python Panel widget serves as its anywidget `_esm`. The bundle is committed, so that
// `pip install` of a clone or a git URL needs no Node.js; `npm run check-bundle` (run by the
// README's test command, i.e. by CI) rebuilds it in memory and fails when the committed file
// differs. The output depends only on the sources, the locked packages and esbuild's version:
// no timestamps, no absolute paths, no source maps.
import * as esbuild from "esbuild";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outfile = path.resolve(here, "..", "rapidfire_nb", "static", "panel.js");
const watch = process.argv.includes("--watch");
const check = process.argv.includes("--check");

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
  logLevel: check ? "warning" : "info",
  // Paths in comments or names would make the bytes depend on where the checkout lives.
  absWorkingDir: here,
  charset: "utf8",
};

if (watch) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
} else if (check) {
  const result = await esbuild.build({ ...options, write: false });
  const fresh = Buffer.from(result.outputFiles[0].contents);
  let committed;
  try {
    committed = readFileSync(outfile);
  } catch {
    console.error(`check-bundle: ${outfile} is missing; run 'npm run build' and commit it`);
    process.exit(1);
  }
  if (!fresh.equals(committed)) {
    console.error(
      `check-bundle: ${path.relative(path.resolve(here, ".."), outfile)} (${committed.length} bytes) differs from ` +
        `a fresh build of js/ (${fresh.length} bytes): run 'cd js && npm run build' and commit the bundle`,
    );
    process.exit(1);
  }
  console.log(`check-bundle: the committed bundle equals a fresh build (${fresh.length} bytes)`);
} else {
  await esbuild.build(options);
}
