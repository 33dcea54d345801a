#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on 127.0.0.1:$KERMAN_PG_PORT (54329) with its data
# under $KERMAN_PG_ROOT (/tmp/kerman-pg-54329). The cluster is for tests only: fsync is off,
# authentication is `trust` on loopback.
#
#   pg-test-server.sh [start]     installs what is missing (as root, with apt-get, saying so on
#                                 stderr first: Debian's `postgresql`, and `openssl` for the TLS
#                                 certificates), starts the cluster unless it is up, and prints
#                                 its DSN on stdout (logs go to stderr). Idempotent and cheap when
#                                 the server is already up, so `make test` calls it every run.
#   pg-test-server.sh stop        stops the server this script started (the pid it recorded
#                                 must still be the postmaster of its data folder); a server
#                                 started otherwise is left alone, and so is anything else.
#   pg-test-server.sh running     exit status 0 if the server answers.
#   pg-test-server.sh scoped CMD  runs CMD and, if the server was not running before and
#                                 KERMAN_PG_DSN is unset, stops it afterwards (also on Ctrl-C);
#                                 exits with CMD's status. `make test` runs its targets so.
#
# It also serves TLS (ssl=on, for tests/python/postgres/test_postgres_tls.py): a self-signed CA,
# a server certificate for localhost and 127.0.0.1, a client certificate for the role
# kerman_tls_cert (pg_hba `cert`) and a CA that signed nothing, all under <data>/kerman-tls/
# and made here with the openssl CLI; the role kerman_tls_only may connect over TLS only.
# Plain connections work as before. A cluster that is already running without it gets it by
# a configuration reload (ssl is reloadable), never a restart.
set -euo pipefail

PORT="${KERMAN_PG_PORT:-54329}"   # not 5432: never collide with a system cluster
ROOT="${KERMAN_PG_ROOT:-/tmp/kerman-pg-$PORT}"
DSN="postgresql://postgres@127.0.0.1:$PORT/postgres"

log() { echo "pg-test-server: $*" >&2; }

# The pid of the postmaster this script started, so `stop` never stops another server.
STARTED="$ROOT/started-by-script.pid"

pg_bin() {
    # Highest installed major version; Debian keeps the server binaries off PATH.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

TLS="$ROOT/data/kerman-tls"
tls_ready() { [ -s "$TLS/ready" ]; }

BIN="$(pg_bin)"

answers() { [ -n "$BIN" ] && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; }

as_postgres() {
    # initdb and postgres refuse to run as root: run them as the package's `postgres` user.
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop_server() {
    local pidfile="$ROOT/data/postmaster.pid" ours running_pid
    ours="$(cat "$STARTED" 2>/dev/null || true)"
    running_pid="$(head -n 1 "$pidfile" 2>/dev/null || true)"
    if [ -z "$running_pid" ] || ! kill -0 "$running_pid" 2>/dev/null; then
        rm -f "$STARTED"
        return 0
    fi
    if [ -z "$ours" ] || [ "$ours" != "$running_pid" ]; then
        log "the server of $ROOT/data (pid $running_pid) was not started by this script: left running"
        return 0
    fi
    log "stopping the test PostgreSQL server (pid $running_pid, $ROOT/data)"
    as_postgres "$BIN/pg_ctl" -D "$ROOT/data" -m fast -w -t 60 stop >&2
    rm -f "$STARTED"
}

case "${1:-start}" in
start) ;;
stop)
    stop_server
    exit 0
    ;;
running)
    answers
    exit
    ;;
scoped)
    shift
    [ "$#" -gt 0 ] || { log "usage: $0 scoped COMMAND [ARG...]"; exit 2; }
    if [ -n "${KERMAN_PG_DSN:-}" ] || answers; then
        exec "$@"  # a server of the user's, or one already running: not ours to stop
    fi
    trap 'stop_server' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    status=0
    "$@" || status=$?
    exit "$status"
    ;;
*)
    log "usage: $0 [start] | stop | running | scoped COMMAND [ARG...]"
    exit 2
    ;;
esac

if [ -n "$BIN" ] && tls_ready && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
    echo "$DSN"
    exit 0
fi

# Two `make test` runs at once must not both initdb the same folder. (Not `$ROOT.lock`: a
# server started by an earlier version of this script inherited that lock and holds it.)
mkdir -p "$ROOT"
exec 9>"$ROOT.setup.lock"
flock 9

if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed and we are not root"; exit 1; }
    log "installing Debian's postgresql package (apt-get install -y postgresql); set KERMAN_PG_DSN to use a server of yours instead"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
    BIN="$(pg_bin)"
fi

if [ "$(id -u)" = 0 ]; then
    chown postgres: "$ROOT"
fi
as_pg() { as_postgres "$@"; }

if [ ! -s "$ROOT/data/PG_VERSION" ]; then
    rm -rf "$ROOT/data"
    as_pg "$BIN/initdb" -D "$ROOT/data" -U postgres -A trust -E UTF8 --no-sync >"$ROOT/initdb.log" 2>&1 \
        || { cat "$ROOT/initdb.log" >&2; exit 1; }
fi

if ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
    # -w waits until the server accepts connections (pg_ctl polls; no sleep of ours). The
    # server must not inherit the lock (9>&-), or it would hold it for as long as it runs.
    as_pg "$BIN/pg_ctl" -D "$ROOT/data" -l "$ROOT/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $PORT -k $ROOT -c fsync=off -c full_page_writes=off" start >&2 9>&- \
        || { tail -n 30 "$ROOT/server.log" >&2; exit 1; }
    head -n 1 "$ROOT/data/postmaster.pid" >"$STARTED"
fi

psql_pg() { "$BIN/psql" "host=127.0.0.1 port=$PORT user=postgres dbname=postgres sslmode=disable" -XAtq "$@"; }

# The certificates, the pg_hba rules and ssl=on. Each step checks what is there, so a run
# interrupted half way is finished by the next one.
setup_tls() {
    if ! command -v openssl >/dev/null; then
        [ "$(id -u)" = 0 ] || { log "openssl is not installed and we are not root"; exit 1; }
        log "installing Debian's openssl package (apt-get install -y openssl), for the TLS test certificates"
        apt-get install -y -q openssl >&2 || { apt-get update -q >&2 && apt-get install -y -q openssl >&2; }
    fi
    as_pg mkdir -p -m 700 "$TLS"
    if [ ! -s "$TLS/client.crt" ]; then
        log "making the TLS certificates in $TLS"
        # EC P-256 keys: generated at once, and every TLS stack takes them.
        as_pg bash -euc '
            cd "$1"; umask 077
            key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
            ca() {
                key "$1.key"
                openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 3650 -subj "/CN=$2" \
                    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
            }
            leaf() {  # name, subject CN, extensions
                key "$1.key"
                openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
                printf "%s\n" "$3" >"$1.ext"
                openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
                    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
                rm -f "$1.csr" "$1.ext"
            }
            ca ca "kerman test CA"
            ca wrong-ca "kerman test CA that signed nothing"
            leaf server localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth"
            leaf client kerman_tls_cert "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
            chmod 644 ./*.crt
        ' _ "$TLS"
    fi
    if ! grep -q '^# kerman-tls' "$ROOT/data/pg_hba.conf"; then
        # First match wins: these go before initdb's `trust` lines.
        local rules
        rules="# kerman-tls: roles of the TLS tests (scripts/pg-test-server.sh)
hostssl   all kerman_tls_cert 127.0.0.1/32 cert
hostnossl all kerman_tls_cert 127.0.0.1/32 reject
hostssl   all kerman_tls_only 127.0.0.1/32 trust
hostnossl all kerman_tls_only 127.0.0.1/32 reject"
        as_pg bash -c 'f="$1/pg_hba.conf"; { printf "%s\n\n" "$2"; cat "$f"; } >"$f.new" && mv "$f.new" "$f"' _ "$ROOT/data" "$rules"
    fi
    psql_pg >/dev/null <<SQL
ALTER SYSTEM SET ssl = on;
ALTER SYSTEM SET ssl_cert_file = '$TLS/server.crt';
ALTER SYSTEM SET ssl_key_file = '$TLS/server.key';
ALTER SYSTEM SET ssl_ca_file = '$TLS/ca.crt';
SELECT pg_reload_conf();
DO \$\$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kerman_tls_cert') THEN CREATE ROLE kerman_tls_cert LOGIN; END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kerman_tls_only') THEN CREATE ROLE kerman_tls_only LOGIN; END IF;
END \$\$;
SQL
    # The reload is applied by the postmaster asynchronously: wait (bounded) until a new
    # connection gets TLS.
    local i
    for i in $(seq 100); do
        if "$BIN/psql" "host=127.0.0.1 port=$PORT user=postgres dbname=postgres sslmode=require" -XAtqc 'SELECT 1' >/dev/null 2>&1; then
            as_pg bash -c 'echo "$2" >"$1/ready"' _ "$TLS" "ssl=on, CA $TLS/ca.crt"
            return 0
        fi
        sleep 0.1
    done
    log "the server does not accept TLS connections after the reload:"; tail -n 20 "$ROOT/server.log" >&2; exit 1
}
tls_ready || setup_tls
echo "$DSN"
