#!/usr/bin/env bash
# `make check-windows`: the Windows port checked on this Linux machine (docs/testing.md,
# "Windows"). For x86_64-pc-windows-gnu, with std built from source (rustup has no Windows
# std here; Debian's rustc-web and rust-web-src have its source), linked by MinGW-w64:
#
# 1. clippy, every warning an error, over every target with `--features python,postgres` and
#    with no features (the python feature is checked against a CPython 3.12 configuration:
#    nothing is linked, so no Windows Python is needed);
# 2. the Rust core's unit and integration tests (no features: the python feature needs a
#    Windows CPython to run, postgres a server) as Windows programs under Wine;
# 3. with WINDOWS_WHEEL=1, a Windows wheel built with maturin (pyo3's generate-import-lib
#    makes python3X.dll's import library without a Windows Python), its tags and contents
#    checked. It cannot be imported here: there is no Windows CPython (docs/testing.md).
#
# Installs what it needs with apt (Debian bookworm: rustc-web 1.96 and cargo-web from
# bookworm-security, gcc-mingw-w64-x86-64, wine64). std's own dependencies come from crates.io.
# Build output goes to $CARGO_TARGET_DIR/windows (this toolchain's, apart from the usual one).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "windows-check: $*" >&2; }

packages=(rustc-web cargo-web rust-web-src rust-web-clippy gcc-mingw-w64-x86-64 wine wine64)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# Debian's toolchain, not rustup's (which has no Windows std): its cargo, rustc, cargo-clippy
# and clippy-driver come first on PATH. RUSTC_BOOTSTRAP lets the stable compiler build std
# (-Zbuild-std).
export PATH="/usr/bin:$PATH"
unset RUSTC RUSTDOC RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER
export RUSTC_BOOTSTRAP=1
TARGET=x86_64-pc-windows-gnu
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/windows"
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine
# A private Wine prefix, and no Wine debug chatter in the test output.
export WINEPREFIX="$CARGO_TARGET_DIR/wine" WINEDEBUG=-all
# The python feature's build script, cross-compiling with no Windows Python: a CPython 3.12
# configuration (the import library is generated only when linking a wheel).
export PYO3_CROSS_PYTHON_VERSION=3.12
build_std=(-Zbuild-std=std,panic_abort --target "$TARGET")

# Wine 8 (bookworm's) lacks bcryptprimitives.dll, whose ProcessPrng std's Windows random
# source has called since Rust 1.78 (Windows 10 and later have it): without it no test binary
# starts. A stand-in DLL over RtlGenRandom goes into the private prefix's system32 (a Wine gap,
# nothing a Windows machine needs).
shim="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
if [ ! -s "$shim" ]; then
    log "setting up the Wine prefix and its bcryptprimitives.dll stand-in"
    mkdir -p "$WINEPREFIX"
    wineboot -i >/dev/null 2>&1 || true
    src="$(mktemp -d)"
    cat >"$src/shim.c" <<'C'
#include <windows.h>
#include <ntsecapi.h>
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!RtlGenRandom(data, chunk)) return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
C
    printf 'LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng\n' >"$src/shim.def"
    x86_64-w64-mingw32-gcc -shared -O2 -o "$shim" "$src/shim.c" "$src/shim.def" -ladvapi32
    rm -rf "$src"
fi

# Every step runs even when one before it failed, so one run tells everything; the script
# fails at the end if any did.
failed=()
step() {
    local name="$1"
    shift
    log "$name"
    "$@" || { failed+=("$name"); log "FAILED: $name"; }
}

log "toolchain: $(rustc --version), $(cargo --version)"
# clippy's missing_const_for_thread_local misfires on std's own thread_local! when std is
# built from source (every `const { }` initializer of the crate is reported); Linux's lint run
# (make lint) still checks it.
lints=(-D warnings -A clippy::missing_const_for_thread_local)
step "clippy --features python,postgres" cargo clippy "${build_std[@]}" --all-targets --features python,postgres -- "${lints[@]}"
step "clippy, no features" cargo clippy "${build_std[@]}" --all-targets --no-default-features -- "${lints[@]}"
# Test threads of one binary share a Wine server; the harness's default (one per core) is kept.
step "the Rust core's tests under $(wine --version)" cargo test "${build_std[@]}" --no-default-features -- "$@"

if [ "${WINDOWS_WHEEL:-0}" = 1 ]; then
    log "a Windows wheel"
    # (--features replaces pyproject.toml's list, so it is spelled out in full.)
    py="${PY:-python3}"
    tools="$CARGO_TARGET_DIR/wheel-tools"
    [ -x "$tools/bin/maturin" ] || { "$py" -m venv "$tools" && "$tools/bin/pip" install -q "maturin>=1.16,<2.0"; }
    out="$CARGO_TARGET_DIR/wheels"
    rm -rf "$out"
    step "maturin build" "$tools/bin/maturin" build --release --target "$TARGET" -i "python${PYO3_CROSS_PYTHON_VERSION}" \
        -Z build-std=std,panic_abort --features python,postgres,pyo3/generate-import-lib -o "$out"
    step "the wheel's tags and contents" "$tools/bin/python" scripts/check-windows-wheel.py "$out" "$PYO3_CROSS_PYTHON_VERSION"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    log "failed: ${failed[*]}"
    exit 1
fi
log "ok"
