#!/usr/bin/env bash
# Runs the whole test suite on the compiled output. Tests that create real sandboxes need root.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob globstar
# A run that was interrupted may have left sandboxes and mounts behind: remove them first.
bash scripts/clean-test-leftovers.sh
files=(packages/*/dist/**/*.test.js test/dist/*.test.js)
if [ "${DSEC_SKIP_SLOW:-}" = "1" ]; then
  files=("${files[@]/*debian.test.js}")
fi
exec node --test --test-concurrency=1 --test-reporter=spec "${files[@]}"
