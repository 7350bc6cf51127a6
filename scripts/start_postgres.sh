#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for mimo_ctx's tests and print
# its DSN on stdout (everything else goes to stderr).
#
#   export MIMO_CTX_PG_DSN="$(bash scripts/start_postgres.sh)"
#
# * Installs Debian's `postgresql` package when no server binaries are found
#   (needs root; `apt-get update` runs first).
# * Initialises a cluster in $MIMO_CTX_PG_DATA (default /tmp/mimo_ctx_pg/data),
#   owned by the `postgres` OS user when run as root (PostgreSQL refuses to run
#   as root), else by the current user.
# * Starts it on 127.0.0.1 only, port $MIMO_CTX_PG_PORT (default 54329), with
#   trust authentication and durability switched off (fsync=off): a test server,
#   never a production one.
# * Creates the database $MIMO_CTX_PG_DB (default mimo_ctx_test).
#
# Idempotent: a server already answering on the port is reused, an existing
# cluster is started again, an existing database is kept.
set -euo pipefail

PORT="${MIMO_CTX_PG_PORT:-54329}"
DATA="${MIMO_CTX_PG_DATA:-/tmp/mimo_ctx_pg/data}"
DB="${MIMO_CTX_PG_DB:-mimo_ctx_test}"
BASE="$(dirname "$DATA")"
SOCKET_DIR="$BASE/socket"
LOG="$BASE/server.log"
SUPERUSER=postgres

log() { echo "start_postgres: $*" >&2; }

find_bin() {
  # Newest installed major version's binaries (Debian keeps them off PATH).
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
    echo "$dir"
  fi
}

BIN="$(find_bin)"
if [ -z "$BIN" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "PostgreSQL is not installed and this is not root: install Debian's 'postgresql' package"
    exit 1
  fi
  log "installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
  BIN="$(find_bin)"
  if [ -z "$BIN" ]; then
    log "postgresql installed but no server binaries under /usr/lib/postgresql/*/bin"
    exit 1
  fi
fi
log "using $BIN"

# Run a server binary as the cluster's owner: `postgres` when we are root.
if [ "$(id -u)" -eq 0 ]; then
  OWNER="$SUPERUSER"
  as_owner() { runuser -u "$OWNER" -- "$@"; }
else
  OWNER="$(id -un)"
  as_owner() { "$@"; }
fi

mkdir -p "$BASE" "$SOCKET_DIR"
if [ "$(id -u)" -eq 0 ]; then
  chown "$OWNER" "$BASE" "$SOCKET_DIR"
fi
chmod 700 "$BASE"

PSQL=("$BIN/psql" -h 127.0.0.1 -p "$PORT" -U "$SUPERUSER" -X -q -v ON_ERROR_STOP=1)

if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  log "a server already answers on 127.0.0.1:$PORT; reusing it"
else
  if [ ! -s "$DATA/PG_VERSION" ]; then
    log "initialising a cluster in $DATA"
    rm -rf "$DATA"
    as_owner "$BIN/initdb" -D "$DATA" -U "$SUPERUSER" --auth=trust \
      --encoding=UTF8 --no-locale >"$BASE/initdb.log" 2>&1 || {
      cat "$BASE/initdb.log" >&2
      exit 1
    }
  fi
  # A pid file left by a server that was killed (with its session or machine)
  # would stop the start, even more so once its pid belongs to another process.
  if [ -f "$DATA/postmaster.pid" ]; then
    pid="$(head -n 1 "$DATA/postmaster.pid" | tr -dc '0-9')"
    if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" != "postgres" ]; then
      log "removing a stale postmaster.pid"
      rm -f "$DATA/postmaster.pid"
    fi
  fi
  log "starting on 127.0.0.1:$PORT (log: $LOG)"
  OPTS="-c listen_addresses=127.0.0.1 -p $PORT -k $SOCKET_DIR"
  OPTS="$OPTS -c max_connections=200 -c fsync=off -c synchronous_commit=off"
  OPTS="$OPTS -c full_page_writes=off"
  if ! as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -o "$OPTS" -w -t 60 start >&2; then
    tail -n 40 "$LOG" >&2 || true
    exit 1
  fi
fi

if [ "$("${PSQL[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
  log "creating database $DB"
  "${PSQL[@]}" -d postgres -c "CREATE DATABASE \"$DB\"" >&2
fi

echo "postgresql://$SUPERUSER@127.0.0.1:$PORT/$DB"
