#!/usr/bin/env bash
# make wheels: a manylinux wheel for every CPython 3.10-3.14 on this machine
# (scripts/find-pythons.py), plus the sdist, into WHEEL_DIR (default dist/wheels), each wheel
# checked with auditwheel (scripts/check-wheels.py).
#
# No container: maturin links with zig (the `ziglang` package), which targets an old glibc
# (MANYLINUX, default manylinux2014 = glibc 2.17, what the release workflow's Linux wheels use)
# whatever glibc this machine has. maturin, ziglang and auditwheel go into a venv under the cargo
# target directory (created on first use), never into the Python that runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
OUT=${WHEEL_DIR:-dist/wheels}
MANYLINUX=${MANYLINUX:-manylinux2014}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
TOOLS="$TARGET/wheel-tools"
# maturin as in pyproject.toml's build-system; ziglang through maturin's own `zig` extra, which
# holds it to the versions that maturin release supports.
TOOL_REQUIREMENTS=("maturin[zig]>=1.16,<2.0" "auditwheel>=6")

if ! "$TOOLS/bin/python" -c "import ziglang" 2>/dev/null || [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/maturin" ]; then
    echo "build-wheels: installing maturin, ziglang and auditwheel into $TOOLS"
    rm -rf "$TOOLS"
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${TOOL_REQUIREMENTS[@]}"
fi

mapfile -t found < <("$PY" scripts/find-pythons.py)
versions=() interpreters=()
for line in "${found[@]}"; do
    versions+=("${line%% *}")
    interpreters+=("${line#* }")
done
echo "build-wheels: CPython ${versions[*]}"

rm -rf "$OUT"
mkdir -p "$OUT"
# maturin runs `python3 -m ziglang` for zig: the tools venv first on PATH provides it.
export PATH="$TOOLS/bin:$PATH" CARGO_TARGET_DIR="$TARGET"
maturin build --release --zig --compatibility "$MANYLINUX" --interpreter "${interpreters[@]}" --out "$OUT"
maturin sdist --out "$OUT"
"$TOOLS/bin/python" scripts/check-wheels.py --sdist "$OUT" "$TOOLS/bin/auditwheel" "${versions[@]}"
echo "build-wheels: $(ls "$OUT" | wc -l) files in $OUT"
