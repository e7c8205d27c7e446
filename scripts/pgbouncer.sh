#!/usr/bin/env bash
# PgBouncer in front of a PostgreSQL server on 127.0.0.1, for tests, CI and benchmarks:
#   scripts/pgbouncer.sh start DIR SERVER_URL [transaction|session]
#       every database name routed to SERVER_URL's host and port, trust authentication,
#       the pool mode given (default transaction); prints the pooler's URL on stdout (the
#       server URL with the pooler's port in place of the server's)
#   scripts/pgbouncer.sh stop DIR
#   scripts/pgbouncer.sh build DIR
#       PgBouncer built from its source release in DIR (its build packages installed when
#       missing; about a minute); prints the binary's path. The release is PGBOUNCER_SRC (a
#       pgbouncer-X.Y.Z.tar.gz); exit 3 when it is unset or missing (CI then says SKIPPED).
# Installs Debian's pgbouncer when it is missing. PgBouncer will not run as root, so it runs as
# the postgres user. Env: POOL_SIZE (40: server connections per database and user),
# MAX_CLIENTS (2000), PGBOUNCER_BIN (a pgbouncer binary to run instead of Debian's: one built
# from source, e.g. 1.25), MAX_PREPARED_STATEMENTS (written to the settings when set; 1.21 and
# newer: 0 turns off their keeping of prepared statements, whose default is 200 since 1.22).
set -euo pipefail

usage="usage: pgbouncer.sh start DIR SERVER_URL [transaction|session] | stop DIR | build DIR"
cmd=${1:?$usage}
dir=${2:?$usage}

case $cmd in
  start)
    server=${3:?usage: pgbouncer.sh start DIR SERVER_URL [transaction|session]}
    mode=${4:-transaction}
    if [ -n "${PGBOUNCER_BIN:-}" ]; then
      [ -x "$PGBOUNCER_BIN" ] || { echo "PGBOUNCER_BIN=$PGBOUNCER_BIN is not an executable" >&2; exit 1; }
    elif ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
      echo "installing Debian's pgbouncer" >&2
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; } >&2
      # The package starts a system-wide pgbouncer on 6432; this one has its own port.
      systemctl stop pgbouncer >/dev/null 2>&1 || service pgbouncer stop >/dev/null 2>&1 || true
    fi
    bin=${PGBOUNCER_BIN:-$(command -v pgbouncer || echo /usr/sbin/pgbouncer)}
    read -r host port < <(python3 -c "
import sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
print(u.hostname or '127.0.0.1', u.port or 5432)" "$server")
    listen=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir -p "$dir"
    chown postgres "$dir"
    # postgres for the tests' own SQL, orderly for the servers (scripts/pg-cluster.sh).
    printf '"postgres" ""\n"orderly" ""\n' >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $mode
default_pool_size = ${POOL_SIZE:-40}
max_client_conn = ${MAX_CLIENTS:-2000}
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
admin_users = postgres
${MAX_PREPARED_STATEMENTS:+max_prepared_statements = $MAX_PREPARED_STATEMENTS}
INI
    chown -R postgres "$dir"
    runuser -u postgres -- "$bin" -d "$dir/pgbouncer.ini"
    for _ in $(seq 100); do
      python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $listen), 0.2)" 2>/dev/null && break
      sleep 0.1
    done
    python3 -c "
import sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
netloc = (u.username + '@' if u.username else '') + '127.0.0.1:' + sys.argv[2]
print(urllib.parse.urlunparse(u._replace(netloc=netloc)))" "$server" "$listen"
    ;;
  build)
    src=${PGBOUNCER_SRC:-}
    [ -n "$src" ] && [ -f "$src" ] \
      || { echo "pgbouncer: no source release (set PGBOUNCER_SRC to a pgbouncer-X.Y.Z.tar.gz; now: '${src}')" >&2; exit 3; }
    missing=()
    for pkg in autoconf automake libtool pkg-config libevent-dev libssl-dev make gcc; do
      dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2
    fi
    mkdir -p "$dir"
    tar -xzf "$src" -C "$dir"
    top=$(tar -tzf "$src" | awk -F/ 'NR == 1 { print $1 }')
    # `make pgbouncer`: the binary alone (the man pages would need pandoc).
    (cd "$dir/$top" && { [ -x configure ] || ./autogen.sh; } && ./configure --without-cares \
      && make -j"$(nproc)" pgbouncer) >"$dir/build.log" 2>&1 \
      || { tail -20 "$dir/build.log" >&2; echo "pgbouncer: the build failed" >&2; exit 1; }
    # PgBouncer runs as the postgres user, which must reach the binary.
    chmod -R a+rX "$dir"
    echo "$dir/$top/pgbouncer"
    ;;
  stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
      kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
      for _ in $(seq 50); do [ -f "$dir/pgbouncer.pid" ] || break; sleep 0.1; done
    fi
    rm -rf "$dir"
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
