#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: installs Debian's package if missing, starts a
# private cluster on 127.0.0.1 with its data under /tmp, and prints its DSN on stdout (logs go to
# stderr). Idempotent and cheap when the server is already up, so `make test` can call it every
# run. The cluster is for tests only: fsync is off, authentication is `trust` on loopback.
set -euo pipefail

PORT="${KERMAN_PG_PORT:-54329}"   # not 5432: never collide with a system cluster
ROOT="${KERMAN_PG_ROOT:-/tmp/kerman-pg-$PORT}"
DSN="postgresql://postgres@127.0.0.1:$PORT/postgres"

log() { echo "pg-test-server: $*" >&2; }

pg_bin() {
    # Highest installed major version; Debian keeps the server binaries off PATH.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

BIN="$(pg_bin)"
if [ -n "$BIN" ] && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
    echo "$DSN"
    exit 0
fi

# Two `make test` runs at once must not both initdb the same folder.
mkdir -p "$ROOT"
exec 9>"$ROOT.lock"
flock 9

if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed and we are not root"; exit 1; }
    log "installing PostgreSQL from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
    BIN="$(pg_bin)"
fi

# initdb and postgres refuse to run as root: run them as the package's `postgres` user.
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$ROOT"
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

if [ ! -s "$ROOT/data/PG_VERSION" ]; then
    rm -rf "$ROOT/data"
    as_pg "$BIN/initdb" -D "$ROOT/data" -U postgres -A trust -E UTF8 --no-sync >"$ROOT/initdb.log" 2>&1 \
        || { cat "$ROOT/initdb.log" >&2; exit 1; }
fi

if ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
    # -w waits until the server accepts connections (pg_ctl polls; no sleep of ours).
    as_pg "$BIN/pg_ctl" -D "$ROOT/data" -l "$ROOT/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $PORT -k $ROOT -c fsync=off -c full_page_writes=off" start >&2 \
        || { tail -n 30 "$ROOT/server.log" >&2; exit 1; }
fi
echo "$DSN"
