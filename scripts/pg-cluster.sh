#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on 127.0.0.1 for tests, CI and the crash trials:
#   scripts/pg-cluster.sh start DIR   initdb (as the postgres user), start on a free port,
#                                     print the maintenance URL on stdout
#   scripts/pg-cluster.sh stop DIR    stop it (fast) and remove DIR
#   scripts/pg-cluster.sh restart DIR stop and start on the same port and data
#   scripts/pg-cluster.sh down DIR    stop, keeping the data;  up DIR: start it again
# Installs Debian's postgresql when no server binaries are found. fsync and
# synchronous_commit stay on: a 200 from orderly means committed on disk.
set -euo pipefail

cmd=${1:?usage: pg-cluster.sh start|stop|restart|down|up DIR}
dir=${2:?usage: pg-cluster.sh start|stop|restart|down|up DIR}

bin_dir() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

if ! bindir=$(bin_dir); then
  echo "installing Debian's postgresql" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  bindir=$(bin_dir) || { echo "no PostgreSQL server binaries after the install" >&2; exit 1; }
fi

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
CONF
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    echo "$port" >"$dir/port"
    echo "postgres://postgres@127.0.0.1:$port/postgres"
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
  down) # stop, keeping the data and the port
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2
    ;;
  up) # start again after down
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 start >&2
    ;;
  *)
    echo "usage: pg-cluster.sh start|stop|restart|down|up DIR" >&2
    exit 2
    ;;
esac
