#!/usr/bin/env bash
# prepare-deps.sh — run HERE (a Debian machine with apt and network), before borrowing a GPU machine:
# downloads the build/runtime dependencies the device machine's image lacks (jansson, libwebsockets,
# OpenBLAS, OpenSSL, SQLite, hiredis, libuv, libcap, pkg-config and their -dev packages) with `apt-get download` and
# unpacks them with `dpkg -x` into the git-ignored .deps/ folder, which the device `run` tool carries
# (carry: [".deps"]). Debian 12 libraries (glibc 2.36) run on the newer glibc of the device image.
# scripts/gpu/run-checks.sh then configures CMake against .deps (PKG_CONFIG_SYSROOT_DIR etc.).
# No root needed. Idempotent: re-run to refresh. Prints the size that will travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DEPS=$ROOT/.deps
PKGS=(
  libjansson4 libjansson-dev
  libwebsockets17 libwebsockets-dev libuv1 libuv1-dev libcap2 libcap-dev
  libssl3 libssl-dev
  libsqlite3-0 libsqlite3-dev
  libhiredis0.14 libhiredis-dev
  libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5 libquadmath0
  pkgconf pkgconf-bin libpkgconf3
)
rm -rf "$DEPS" && mkdir -p "$DEPS/debs"
(cd "$DEPS/debs" && apt-get download "${PKGS[@]}" >/dev/null)
for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS"; done
rm -rf "$DEPS/debs" "$DEPS/usr/share/doc" "$DEPS/usr/share/man" "$DEPS/usr/share/lintian" "$DEPS/usr/share/locale"
# what unmask does not use would blow the 64 MiB carry budget: static archives, LAPACK and the
# reference BLAS shims (only OpenBLAS's cblas is linked), libcap's test tree, OpenSSL engines/modules
find "$DEPS" -name '*.a' -delete
rm -rf "$DEPS"/usr/lib/x86_64-linux-gnu/openblas-pthread/{liblapack,libblas}.so* \
       "$DEPS"/usr/lib/x86_64-linux-gnu/libcap2 "$DEPS"/usr/lib/x86_64-linux-gnu/{engines-3,ossl-modules}

ARCH=x86_64-linux-gnu
LIB=$DEPS/usr/lib/$ARCH
# Debian wires OpenBLAS through update-alternatives (postinst), which dpkg -x does not run: make the
# links the build and the loader need.
ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$LIB/pkgconfig/openblas.pc"
ln -sf openblas-pthread/libopenblas.so "$LIB/libopenblas.so"
ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so.0"
# pkgconf as pkg-config
ln -sf pkgconf "$DEPS/usr/bin/pkg-config"
# sanity: every shared library we carry resolves its carried dependencies from .deps
missing=$(LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread" ldd "$LIB"/libwebsockets.so.* "$LIB"/libjansson.so.* \
            "$LIB/openblas-pthread/libopenblas.so.0" 2>/dev/null | grep "not found" || true)
[ -n "$missing" ] && { echo "prepare-deps: unresolved libraries:"; echo "$missing"; exit 1; }
echo "prepare-deps: .deps ready ($(du -sh "$DEPS" | cut -f1)); working tree that travels: \
$(git ls-files -z | du -ch --files0-from=- 2>/dev/null | tail -1 | cut -f1) tracked"
