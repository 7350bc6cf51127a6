#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for mimo_ctx's tests and print
# its DSN on stdout (everything else goes to stderr).
#
#   export MIMO_CTX_PG_DSN="$(bash scripts/start_postgres.sh)"
#
# * Finds the server binaries of the newest installed major version under
#   /usr/lib/postgresql/<major>/bin (Debian keeps them off PATH); a version with
#   only the client tools installed is passed over.
# * Installs Debian's `postgresql` package when no server binaries are found:
#   as root, or through passwordless sudo (`apt-get update` runs first; apt waits
#   for a dpkg lock held by e.g. unattended-upgrades on a fresh machine). The
#   package also creates and may start its own default cluster on port 5432; this
#   script never uses or stops that one.
# * Initialises a cluster in $MIMO_CTX_PG_DATA (default /tmp/mimo_ctx_pg/data),
#   owned by the `postgres` OS user when run as root (PostgreSQL refuses to run
#   as root), else by the current user. A cluster left there by another major
#   version is a throwaway test cluster: it is initialised again.
# * Starts it on 127.0.0.1 only, port $MIMO_CTX_PG_PORT (default 54329), with
#   trust authentication and durability switched off (fsync=off): a test server,
#   never a production one.
# * Creates the database $MIMO_CTX_PG_DB (default mimo_ctx_test).
#
# Idempotent: a server already answering on the port is reused, an existing
# cluster is started again, an existing database is kept.
#
# Sourcing the script (`source scripts/start_postgres.sh`) only defines its
# functions; tests use that to check find_bin.
set -euo pipefail

PORT="${MIMO_CTX_PG_PORT:-54329}"
DATA="${MIMO_CTX_PG_DATA:-/tmp/mimo_ctx_pg/data}"
DB="${MIMO_CTX_PG_DB:-mimo_ctx_test}"
# Where Debian installs one directory per major version (overridable for tests).
PG_LIB="${MIMO_CTX_PG_LIB:-/usr/lib/postgresql}"
BASE="$(dirname "$DATA")"
SOCKET_DIR="$BASE/socket"
LOG="$BASE/server.log"
SUPERUSER=postgres

log() { echo "start_postgres: $*" >&2; }

# The bin directory of the newest major version that has the server programs.
find_bin() {
  local dir
  while IFS= read -r dir; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  done < <(find "$PG_LIB" -mindepth 2 -maxdepth 2 -type d -name bin 2>/dev/null | sort -rV)
  return 0
}

# The major version a bin directory belongs to (/usr/lib/postgresql/15/bin -> 15).
major_of() {
  basename "$(dirname "$1")"
}

# A client tool of the same version, else the one on PATH.
client_tool() {
  if [ -x "$BIN/$1" ]; then
    echo "$BIN/$1"
  elif command -v "$1" >/dev/null 2>&1; then
    command -v "$1"
  else
    log "no $1 found (neither in $BIN nor on PATH)"
    return 1
  fi
}

install_postgresql() {
  local -a sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      log "PostgreSQL is not installed and this is neither root nor passwordless sudo:"
      log "install Debian's 'postgresql' package (apt-get install postgresql), then run again"
      exit 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL is not installed and apt-get is missing (not Debian/Ubuntu?):"
    log "install a PostgreSQL server, or point MIMO_CTX_PG_DSN at one"
    exit 1
  fi
  log "installing Debian's postgresql package"
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
  "${sudo[@]}" "${apt[@]}" update -qq >&2
  "${sudo[@]}" "${apt[@]}" install -y -qq --no-install-recommends postgresql >&2
}

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$SUPERUSER" -- "$@"
  else
    "$@"
  fi
}

main() {
  BIN="$(find_bin)"
  if [ -z "$BIN" ]; then
    install_postgresql
    BIN="$(find_bin)"
    if [ -z "$BIN" ]; then
      log "postgresql installed, but no server binaries (initdb, pg_ctl, postgres) under $PG_LIB/*/bin"
      exit 1
    fi
  fi
  local major
  major="$(major_of "$BIN")"
  log "using PostgreSQL $major ($BIN)"
  local psql pg_isready
  psql="$(client_tool psql)"
  pg_isready="$(client_tool pg_isready)"

  if [ "$(id -u)" -eq 0 ] && ! id -u "$SUPERUSER" >/dev/null 2>&1; then
    log "running as root, but there is no '$SUPERUSER' OS user to own the cluster"
    log "(the Debian package creates it; or run this script as an ordinary user)"
    exit 1
  fi

  mkdir -p "$BASE" "$SOCKET_DIR"
  if [ "$(id -u)" -eq 0 ]; then
    chown "$SUPERUSER" "$BASE" "$SOCKET_DIR"
  fi
  chmod 700 "$BASE"

  local -a PSQL=("$psql" -h 127.0.0.1 -p "$PORT" -U "$SUPERUSER" -X -q -v ON_ERROR_STOP=1)

  local ready=0
  "$pg_isready" -q -h 127.0.0.1 -p "$PORT" || ready=$?
  if [ "$ready" -eq 1 ]; then
    # A server is starting up (or shutting down) on the port: give it a minute.
    log "a server on 127.0.0.1:$PORT is not accepting connections yet; waiting"
    for _ in $(seq 60); do
      sleep 1
      ready=0
      "$pg_isready" -q -h 127.0.0.1 -p "$PORT" || ready=$?
      [ "$ready" -eq 1 ] || break
    done
  fi
  if [ "$ready" -eq 0 ]; then
    log "a server already answers on 127.0.0.1:$PORT; reusing it"
  else
    if [ -s "$DATA/PG_VERSION" ] && [ "$(cat "$DATA/PG_VERSION")" != "$major" ]; then
      log "$DATA holds a PostgreSQL $(cat "$DATA/PG_VERSION") cluster; initialising one for $major"
      rm -rf "$DATA"
    fi
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
      local pid
      pid="$(head -n 1 "$DATA/postmaster.pid" | tr -dc '0-9')"
      if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" != "postgres" ]; then
        log "removing a stale postmaster.pid"
        rm -f "$DATA/postmaster.pid"
      fi
    fi
    log "starting on 127.0.0.1:$PORT (log: $LOG)"
    local opts="-c listen_addresses=127.0.0.1 -p $PORT -k $SOCKET_DIR"
    opts="$opts -c max_connections=200 -c fsync=off -c synchronous_commit=off"
    opts="$opts -c full_page_writes=off"
    if ! as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -o "$opts" -w -t 60 start >&2; then
      tail -n 40 "$LOG" >&2 || true
      exit 1
    fi
  fi

  if [ "$("${PSQL[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
    log "creating database $DB"
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE \"$DB\"" >&2
  fi

  echo "postgresql://$SUPERUSER@127.0.0.1:$PORT/$DB"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
