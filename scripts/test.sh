#!/usr/bin/env bash
# Run the whole test suite the way CI does: install the locked environment, start the services
# the tests use (PostgreSQL for the monitor store, Chromium for the dashboard's browser test,
# Xvfb desktops with real apps for the desktop gym),
# then pytest. Safe to run again: every step is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet uv
fi
uv sync --frozen --compile-bytecode

# The real inference servers' own code (SGLang, vLLM) in environments of their own, for
# tests/conformance; required here, so those tests fail rather than skip without them.
bash scripts/conformance_envs.sh
export CUA_REQUIRE_CONFORMANCE=1

if [ -f .ci/services.sh ]; then
  # shellcheck source=/dev/null
  source .ci/services.sh
fi
if [ -f .ci/desktop.sh ]; then
  # shellcheck source=/dev/null
  source .ci/desktop.sh
fi

uv run ruff check cua_native tests bench
uv run ruff format --check cua_native tests bench
uv run mypy
uv run pytest "$@"
