#!/usr/bin/env bash
# A throwaway PgBouncer in transaction pooling mode in front of the test server
# (scripts/pg-test-server.sh, 127.0.0.1:54329), for tests/python/postgres/test_pgbouncer.py.
#
#   pgbouncer-test.sh start   installs Debian's pgbouncer if missing, starts it on 127.0.0.1:$PORT
#                             (never as root: pgbouncer refuses it) unless it already
#                             runs, and prints "<pid> <started: 1|0>" on stdout (as root it
#                             runs it as the postgres user, which the server's package made)
#   pgbouncer-test.sh stop PID  stops that pgbouncer (the pid start printed), only if it is ours
#   pgbouncer-test.sh install   installs Debian's pgbouncer if missing (as root, with apt-get,
#                             saying so on stderr first); `make test` runs it before the suite
#
# Every database name is forwarded to the server (`* =`), trust auth, `options` ignored at
# startup (the server would get no per-test search path through transaction pooling anyway:
# tests use a database of their own). Tests only.
set -euo pipefail

PORT="${KERMAN_PGBOUNCER_PORT:-54339}"
SERVER_PORT="${KERMAN_PG_PORT:-54329}"
ROOT="${KERMAN_PGBOUNCER_ROOT:-/tmp/kerman-pgbouncer-$PORT}"
PIDFILE="$ROOT/pgbouncer.pid"

log() { echo "pgbouncer-test: $*" >&2; }

running() { [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

install_missing() {
    if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
        [ "$(id -u)" = 0 ] || { log "pgbouncer is not installed and we are not root"; exit 1; }
        log "installing Debian's pgbouncer package (apt-get install -y pgbouncer), for tests/python/postgres/test_pgbouncer.py"
        apt-get install -y -q pgbouncer >&2 || { apt-get update -q >&2 && apt-get install -y -q pgbouncer >&2; }
    fi
}

case "${1:-}" in
install)
    install_missing
    ;;
start)
    install_missing
    BIN="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
    mkdir -p "$ROOT"
    exec 9>"$ROOT.lock"
    flock 9
    if running; then
        echo "$(cat "$PIDFILE") 0"
        exit 0
    fi
    echo '"postgres" ""' >"$ROOT/userlist.txt"
    cat >"$ROOT/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$SERVER_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $ROOT/userlist.txt
pool_mode = transaction
ignore_startup_parameters = extra_float_digits,options
max_client_conn = 1000
default_pool_size = 8
server_reset_query =
logfile = $ROOT/pgbouncer.log
pidfile = $PIDFILE
INI
    rm -f "$PIDFILE"
    # Not holding the setup lock (fd 9) nor our output: the daemon would keep them open for
    # its whole life (a caller reading our output to its end would wait for it).
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$ROOT"
        runuser -u postgres -- "$BIN" -d "$ROOT/pgbouncer.ini" >>"$ROOT/start.log" 2>&1 9>&-
    else
        "$BIN" -d "$ROOT/pgbouncer.ini" >>"$ROOT/start.log" 2>&1 9>&-
    fi
    for _ in $(seq 200); do
        running && break
        sleep 0.05
    done
    running || { log "did not start; see $ROOT/pgbouncer.log"; exit 1; }
    echo "$(cat "$PIDFILE") 1"
    ;;
stop)
    pid="${2:?stop needs the pid start printed}"
    if running && [ "$(cat "$PIDFILE")" = "$pid" ]; then
        kill "$pid"
    fi
    ;;
*)
    echo "usage: $0 start | stop PID | install" >&2
    exit 2
    ;;
esac
