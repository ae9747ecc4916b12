#!/usr/bin/env bash
# Install a pinned n8n (1.123.x, the last line that runs on Node 20) into a cache folder
# outside the repository, once per machine. Prints the n8n executable's path on the last line.
#
#   bash scripts/install_n8n.sh            # install if missing, print the path
#   N8N_VERSION=1.123.81 N8N_CACHE_DIR=/somewhere bash scripts/install_n8n.sh
#
# Two npm `overrides` make n8n 1.123 install on Node 20 from the npm registry alone:
#   xlsx 0.18.5        n8n's own dependency points at a tarball outside the registry;
#   isolated-vm 5.0.4  isolated-vm 6 needs Node 22, 5.0.4 builds on Node 20.
# About 5 minutes and 1.8 GB. Concurrent callers wait on one lock; a half-done install is
# never taken for a finished one (it is built in a sibling folder and moved into place).
set -euo pipefail

N8N_VERSION="${N8N_VERSION:-1.123.81}"
CACHE_ROOT="${N8N_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceguard}"
TARGET="$CACHE_ROOT/n8n-$N8N_VERSION"
BIN="$TARGET/node_modules/.bin/n8n"

if [[ -f "$TARGET/.installed" && -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

command -v npm >/dev/null || { echo "install_n8n: npm is not installed (Node 20 + npm needed)" >&2; exit 2; }
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if (( node_major < 20 )); then
  echo "install_n8n: Node $(node --version) is too old; n8n $N8N_VERSION needs Node >= 20.19" >&2
  exit 2
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.n8n-$N8N_VERSION.lock"
flock 9
# Another caller may have finished while this one waited.
if [[ -f "$TARGET/.installed" && -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

WORK="$CACHE_ROOT/.n8n-$N8N_VERSION.partial"
rm -rf "$WORK"
mkdir -p "$WORK"
cat >"$WORK/package.json" <<JSON
{
  "name": "onceguard-n8n-runtime",
  "private": true,
  "description": "n8n for Onceguard's integration tests (scripts/install_n8n.sh)",
  "dependencies": { "n8n": "$N8N_VERSION" },
  "overrides": { "xlsx": "0.18.5", "isolated-vm": "5.0.4" }
}
JSON

started=$(date +%s)
echo "install_n8n: installing n8n $N8N_VERSION into $TARGET (about 5 minutes, 1.8 GB)" >&2
(
  cd "$WORK"
  npm install --omit=dev --no-audit --no-fund --loglevel=error >&2
)
"$WORK/node_modules/.bin/n8n" --version >&2
rm -rf "$TARGET"
mv "$WORK" "$TARGET"
date -u +%FT%TZ >"$TARGET/.installed"
echo "install_n8n: done in $(( $(date +%s) - started ))s" >&2
echo "$BIN"
