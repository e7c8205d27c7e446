#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1 for tests, CI and the crash trials:
#   scripts/pg-cluster.sh start DIR   initdb (as the postgres user), start on a free port,
#                                     print the maintenance URL on stdout
#   scripts/pg-cluster.sh stop DIR    stop it (fast) and remove DIR
#   scripts/pg-cluster.sh restart DIR stop and start on the same port and data
#   scripts/pg-cluster.sh down DIR    stop, keeping the data;  up DIR: start it again
#   scripts/pg-cluster.sh standby DIR PRIMARY_URL   a streaming standby of that primary
#                                     (pg_basebackup -R: its primary_conninfo in
#                                     postgresql.auto.conf), started on a free port; prints
#                                     its URL
#   scripts/pg-cluster.sh promote DIR  the standby becomes a primary, with no synchronous
#                                     standby of its own (what an HA manager does)
#   scripts/pg-cluster.sh kill DIR    SIGKILL of the postmaster: a machine lost
#   scripts/pg-cluster.sh crash-restart DIR  stop -m immediate, then start on the same data:
#                                     the same timeline after crash recovery, UNLOGGED
#                                     tables emptied
# Every cluster started is hardened as production runs it: a role `orderly` (LOGIN, not a
# superuser, no CREATEDB) for orderly to run as, owning the databases made for it, and the
# pg_control_* and WAL-inspection functions not executable by PUBLIC (revoked in template1,
# which every database is made from, and in postgres). Tests and harnesses connect as
# `postgres` for their own SQL.
# Installs Debian's postgresql when no server binaries are found. fsync and
# synchronous_commit stay on: a 200 from orderly means committed on disk.
# PG_CONF_EXTRA (start only): more lines for postgresql.conf, e.g. WAL archiving for a
# point-in-time restore ("archive_mode = on" and an archive_command), which needs a restart
# to change later.
set -euo pipefail

cmd=${1:?usage: pg-cluster.sh start|stop|restart|down|up|standby|promote|kill|crash-restart DIR}
dir=${2:?usage: pg-cluster.sh start|stop|restart|down|up DIR}

# shellcheck source=scripts/pg-common.sh
source "$(dirname "$0")/pg-common.sh" # bindir, revoke_from_public

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case $cmd in
  start)
    mkdir -p "$dir"
    chown postgres "$dir"
    chmod 700 "$dir"
    as_postgres "$bindir/initdb" -D "$dir/data" -U postgres -A trust --locale=C.UTF-8 -E UTF8 >"$dir/initdb.log" 2>&1 \
      || as_postgres "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >"$dir/initdb.log" 2>&1
    port=$(free_port)
    cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
fsync = on
synchronous_commit = on
max_connections = 400
shared_buffers = 128MB
${PG_CONF_EXTRA:-}
CONF
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    echo "$port" >"$dir/port"
    for db in template1 postgres; do
      as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" -c "$revoke_from_public" >&2
    done
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
      -c "CREATE ROLE orderly LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" >&2
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  crash-restart)
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >&2
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    ;;
  stop)
    if [ -d "$dir/data" ]; then
      as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    fi
    rm -rf "$dir"
    ;;
  restart)
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -m fast -w -t 60 restart >&2
    ;;
  standby)
    primary=${3:?usage: pg-cluster.sh standby DIR PRIMARY_URL}
    read -r phost pport < <(python3 -c "
import sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
print(u.hostname or '127.0.0.1', u.port or 5432)" "$primary")
    mkdir -p "$dir"
    chown postgres "$dir"
    chmod 700 "$dir"
    # A fast checkpoint: the default spread one waits out much of checkpoint_timeout.
    as_postgres "$bindir/pg_basebackup" -h "$phost" -p "$pport" -U postgres -D "$dir/data" -R -X stream -c fast \
      >"$dir/basebackup.log" 2>&1 || { cat "$dir/basebackup.log" >&2; exit 1; }
    port=$(free_port)
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
unix_socket_directories = '$dir'
CONF
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    echo "$port" >"$dir/port"
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  promote)
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -w -t 60 promote >&2
    port=$(cat "$dir/port")
    as_postgres "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
      -c "ALTER SYSTEM SET synchronous_standby_names = ''" -c "SELECT pg_reload_conf()" >/dev/null
    ;;
  kill)
    kill -KILL "$(head -1 "$dir/data/postmaster.pid")"
    ;;
  down) # stop, keeping the data and the port
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2
    ;;
  up) # start again after down
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    ;;
  *)
    echo "usage: pg-cluster.sh start|stop|restart|down|up|standby|promote|kill|crash-restart DIR" >&2
    exit 2
    ;;
esac
