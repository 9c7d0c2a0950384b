// Lint for the panel's TypeScript: ESLint's and typescript-eslint's recommended rules (likely
// bugs, not style). Types are checked by `npm run typecheck` (tsc --noEmit).
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", "build.mjs"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ["src/**/*.ts", "test/**/*.ts"],
    rules: {
      // an unused argument named _x is deliberate (a callback's signature)
      // `any` is a warning: say so, do not fail
      "@typescript-eslint/no-explicit-any": "warn",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
    },
  },
);
