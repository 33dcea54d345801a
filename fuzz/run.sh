#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each: `make fuzz`, part of `make test-slow`.
#
# The committed corpus and reproducers are read but never written: new inputs go to a scratch
# folder, so a run leaves the work tree clean. A crash fails the run and leaves its input in
# fuzz/artifacts/<target>/ (minimise it, then keep it in fuzz/regressions/<target>/).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
targets=(record_reader splice_validator message_from_json)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz from crates.io"
    if ! cargo install --quiet --locked cargo-fuzz; then
        echo "SKIPPED fuzzing: cargo-fuzz is not installed and could not be installed"
        exit 0
    fi
fi

# cargo-fuzz passes nightly-only flags (-Zsanitizer=address); only a stable toolchain is
# available here, and RUSTC_BOOTSTRAP lets it accept them.
export RUSTC_BOOTSTRAP=1
target_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "regressions/$t"
    echo "fuzzing $t for $seconds s"
    if ! cargo fuzz run --target-dir "$target_dir" "$t" "$scratch/$t" "corpus/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
        tail -n 60 "$scratch/$t.log"
        echo "FAILED: fuzz target $t (input kept in fuzz/artifacts/$t/)"
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' "$scratch/$t.log"
done
