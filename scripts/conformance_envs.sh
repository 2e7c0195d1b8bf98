#!/usr/bin/env bash
# The real inference servers' own code, each in a virtual environment of its own (their
# torch/transformers pins clash with the project's): .conformance/<name>/ for every
# tests/conformance/envs/<name>.lock. tests/conformance runs SGLang's and vLLM's request
# handling there, on CPU, against the payloads the project's backends send.
#
#   bash scripts/conformance_envs.sh          build what is missing or stale (CI runs this)
#   bash scripts/conformance_envs.sh --lock   re-resolve every <name>.in into <name>.lock
#
# An environment is rebuilt only when its lock file changes (a stamp holds the lock's hash);
# packages come from uv's cache after the first build, so a warm rebuild takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

envs_dir=tests/conformance/envs
root=.conformance
python_bin="${CUA_CONFORMANCE_PYTHON:-$(command -v python3.11 || command -v python3)}"

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet uv
fi

if [ "${1:-}" = "--lock" ]; then
  for spec in "$envs_dir"/*.in; do
    uv pip compile -q --python "$python_bin" --no-header "$spec" -o "${spec%.in}.lock"
  done
  exit 0
fi

mkdir -p "$root"
for lock in "$envs_dir"/*.lock; do
  name="$(basename "$lock" .lock)"
  target="$root/$name"
  want="$(sha256sum "$lock" | cut -d' ' -f1)"
  if [ -f "$target/.lock-sha256" ] && [ "$(cat "$target/.lock-sha256")" = "$want" ]; then
    continue
  fi
  start=$SECONDS
  rm -rf "$target"
  uv venv -q --python "$python_bin" "$target"
  uv pip sync -q --python "$target/bin/python" "$lock"
  echo "$want" >"$target/.lock-sha256"
  echo "conformance environment $name: built in $((SECONDS - start)) s"
done
