#!/usr/bin/env bash
# install-deps.sh — install every build and test dependency on a fresh Debian (bookworm) machine:
# compilers, CMake, jansson, libwebsockets, OpenSSL, OpenBLAS, SQLite, hiredis, Debian's python3 + NumPy + PyTorch
# (the training pipeline's tests and the bundled model's PyTorch parity test), Node.js, Chromium for
# the browser test, redis-server and nginx-light (the replica tests), and the npm test clients (tests/package-lock.json, npm ci).
# Idempotent and quick when everything is present. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config libjansson-dev libwebsockets-dev libssl-dev libopenblas-dev libsqlite3-dev
      libhiredis-dev python3 python3-numpy python3-torch nodejs chromium openssl ca-certificates curl prometheus
      redis-server nginx-light)
[ "${1:-}" = "--runtime-only" ] && PKGS=(build-essential cmake pkg-config libjansson-dev
      libwebsockets-dev libssl-dev libopenblas-dev libsqlite3-dev libhiredis-dev)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm ships inside nodesource's nodejs; Debian's nodejs needs the separate npm package.
if [ "${1:-}" != "--runtime-only" ] && ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# a tests/node_modules that is a symlink belongs to another checkout (a git worktree sharing the main
# one's install): leave it to that checkout.
if [ "${1:-}" != "--runtime-only" ] && [ -f tests/package-lock.json ] && [ ! -L tests/node_modules ]; then
  if [ ! -d tests/node_modules ] || [ tests/package-lock.json -nt tests/node_modules/.package-lock.json ]; then
    echo "install-deps: npm ci (tests/)"
    (cd tests && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
