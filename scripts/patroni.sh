#!/usr/bin/env bash
# A throwaway two-node PostgreSQL cluster under Patroni 4.1.5 on 127.0.0.1, for tests and CI:
#   scripts/patroni.sh start DIR          install Patroni if missing, start a raft witness and two
#                                         Patroni nodes (node1, node2), wait for a leader and a
#                                         streaming synchronous replica, harden, print the libpq
#                                         multi-host URL for the role orderly (read-write target)
#   scripts/patroni.sh superuser-url DIR  the same multi-host URL for the superuser postgres
#   scripts/patroni.sh leader DIR         the leader's node name (node1 or node2)
#   scripts/patroni.sh switchover DIR     patronictl switchover to the other node; returns once
#                                         the new leader accepts writes
#   scripts/patroni.sh kill-leader DIR    SIGKILL of the leader's Patroni and its postmaster (and
#                                         the postmaster's children): a machine lost; prints the
#                                         killed node's name
#   scripts/patroni.sh wait-leader DIR NODE   until NODE is the leader and accepts writes (60 s)
#   scripts/patroni.sh restart-node DIR NODE  start NODE's Patroni again, same config: it rejoins
#                                         as a replica (through pg_rewind when it diverged)
#   scripts/patroni.sh wait-replica DIR NODE  until NODE streams synchronously from the leader
#                                         (90 s); prints one line saying whether pg_rewind ran
#   scripts/patroni.sh stop DIR           stop everything and remove DIR (after a failed start
#                                         too; a second call does nothing)
# DCS: Patroni's raft (pysyncobj). Two raft members lose their majority when one dies, so a
# third member, `patroni_raft_controller` (Patroni's own witness: raft only, no PostgreSQL),
# runs beside them. synchronous_mode is on (not strict: a lone leader goes on writing),
# use_pg_rewind is on, and ttl/loop_wait/retry_timeout are the smallest Patroni accepts
# (20/1/3 s: Patroni raises smaller values to these, in its _validate_and_adjust_timeouts), so a failover takes about ttl.
# Hardened as scripts/pg-cluster.sh: a role `orderly` (LOGIN, no superuser, no CREATEDB) owning
# the database `orderly`, and the pg_control_* and WAL-inspection functions not executable by
# PUBLIC in template1 and postgres. fsync and synchronous_commit stay on.
# Stdout carries only what is said above; Patroni's logs are DIR/node1.log, DIR/node2.log and
# DIR/witness.log, the ports DIR/env.
set -euo pipefail

usage="usage: patroni.sh start|superuser-url|leader|switchover|kill-leader|stop DIR | wait-leader|restart-node|wait-replica DIR NODE"
cmd=${1:?$usage}
dir=${2:?$usage}
dir=$(realpath -m "$dir") # absolute: the daemons run elsewhere, and own_pid matches it
# Patroni runs as the postgres user (PostgreSQL refuses root), and the Python found on PATH may
# live under /root, which that user cannot read: Patroni gets its own venv from Debian's python3.
venv=${PATRONI_VENV:-/opt/patroni-4.1.5}

# shellcheck source=scripts/pg-common.sh
source "$(dirname "$0")/pg-common.sh" # bindir, revoke_from_public

ensure_patroni() {
  [ -x "$venv/bin/patroni" ] && [ -x "$venv/bin/patroni_raft_controller" ] && return 0
  echo "installing Patroni 4.1.5 into $venv" >&2
  umask 022 # the postgres user must read it
  if ! /usr/bin/python3 -m venv "$venv" >&2; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
    /usr/bin/python3 -m venv "$venv" >&2
  fi
  nice -n 10 "$venv/bin/pip" install -q "patroni[raft,psycopg3]==4.1.5" >&2 ||
    nice -n 10 "$venv/bin/pip" install -q "patroni[raft]==4.1.5" psycopg2-binary >&2
}

free_ports() { # N distinct free ports, all bound at once so that none repeats
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

other() { if [ "$1" = node1 ]; then echo node2; else echo node1; fi; }
port_of() { local v="${1^^}_$2_PORT"; echo "${!v}"; } # port_of node1 PG

# The pid in DIR/NAME.pid, if that process is alive and still ours (its command line names DIR).
own_pid() {
  local pid
  pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -F "$dir/" >/dev/null && echo "$pid"
}
postmaster_pid() {
  local pid
  pid=$(head -1 "$dir/$1/data/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -F "$dir/$1/" >/dev/null && echo "$pid"
}

# A process whose command line names DIR/node1, DIR/node2 or DIR/witness: a Patroni, the witness,
# a postmaster, a runuser parent. Bash builtins only: a grep given that path would find itself.
ours_left() {
  local f args
  for f in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t args 2>/dev/null <"$f" || continue
    [[ " ${args[*]} " == *"$dir/node"[12]* || " ${args[*]} " == *"$dir/witness"* ]] && return 0
  done
  return 1
}

# Start a daemon as the postgres user, in a session of its own, with every standard stream on
# DIR/NAME.log or /dev/null (a caller reading our stdout must not wait for the daemon); it
# writes its own pid (exec keeps it) to DIR/NAME.pid.
launch() { # NAME PROGRAM
  (cd "$dir" && exec setsid runuser -u postgres -- sh -c 'echo $$ >"$1"; exec "$2" "$3"' \
    sh "$dir/$1.pid" "$venv/bin/$2" "$dir/$1.yml") >>"$dir/$1.log" 2>&1 </dev/null &
}

wait_for() { # SECONDS WHAT COMMAND...: poll COMMAND every 0.5 s, at most SECONDS
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "timed out after ${limit}s waiting for $what (logs in $dir)" >&2; return 1; }
    sleep 0.5
  done
}

sql() { # NODE DB SQL: as postgres on NODE, one value out
  PGCONNECT_TIMEOUT=2 "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port_of "$1" PG)" -U postgres -d "$2" -c "$3"
}
is_leader() { [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$(port_of "$1" API)/leader")" = 200 ]; }
accepts_writes() { [ "$(sql "$1" postgres 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" = t ]; }
leading_and_writable() { is_leader "$1" && accepts_writes "$1"; }
leader_node() {
  for n in node1 node2; do is_leader "$n" && { echo "$n"; return 0; }; done
  return 1
}
# NODE streams from the leader as its synchronous standby (application_name = Patroni's name),
# and Patroni knows it: PostgreSQL reports 'sync' a moment before Patroni records NODE in its
# /sync key, and only the node named there may be switched over or failed over to.
sync_replica() {
  local l
  l=$(leader_node) && [ "$l" != "$1" ] && accepts_writes "$l" &&
    [ "$(sql "$l" postgres "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$1'
          AND state = 'streaming' AND sync_state IN ('sync', 'quorum')" 2>/dev/null)" = 1 ] &&
    [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$(port_of "$1" API)/sync")" = 200 ]
}
has_sync_replica() { local l; l=$(leader_node) && sync_replica "$(other "$l")"; }

write_node_config() { # NODE: its configuration file in DIR, named after it
  local n=$1 o
  o=$(other "$n")
  cat >"$dir/$n.yml" <<YAML
scope: orderly
name: $n
restapi:
  listen: 127.0.0.1:$(port_of "$n" API)
  connect_address: 127.0.0.1:$(port_of "$n" API)
raft:
  data_dir: '$dir/$n/raft'
  self_addr: 127.0.0.1:$(port_of "$n" RAFT)
  partner_addrs: ['127.0.0.1:$(port_of "$o" RAFT)', '127.0.0.1:$WITNESS_RAFT_PORT']
bootstrap:
  dcs:
    # The minimums Patroni 4.1.5 accepts: the leader key lives ttl seconds after the leader's
    # last loop, so a lost leader is replaced after about ttl.
    ttl: 20
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1073741824
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 400
        # pg_rewind needs hint-bit changes WAL-logged (or data checksums); Patroni defaults it
        # on, said here so that nobody turns it off.
        wal_log_hints: 'on'
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
postgresql:
  listen: 127.0.0.1:$(port_of "$n" PG)
  connect_address: 127.0.0.1:$(port_of "$n" PG)
  data_dir: '$dir/$n/data'
  bin_dir: '$bindir'
  pgpass: '$dir/$n/pgpass'
  authentication:
    superuser: {username: postgres}
    replication: {username: replicator}
    rewind: {username: rewinder}
  # A fast checkpoint: the default spread one makes a replica's base backup wait.
  basebackup:
  - checkpoint: fast
  parameters:
    unix_socket_directories: '$dir/$n'
    fsync: 'on'
    synchronous_commit: 'on'
    shared_buffers: 128MB
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
YAML
}

case $cmd in
  superuser-url | leader | switchover | kill-leader | wait-leader | restart-node | wait-replica)
    [ -f "$dir/env" ] || { echo "no cluster in $dir" >&2; exit 1; }
    # shellcheck disable=SC1091
    . "$dir/env"
    ;;
esac
node=${3:-}
case $cmd in
  wait-leader | restart-node | wait-replica)
    [ "$node" = node1 ] || [ "$node" = node2 ] || { echo "$usage" >&2; exit 2; }
    ;;
esac

case $cmd in
  start)
    [ ! -e "$dir/env" ] || { echo "$dir already holds a cluster" >&2; exit 1; }
    ensure_patroni
    mkdir -p "$dir/node1" "$dir/node2" "$dir/witness"
    chown -R postgres "$dir"
    chmod 700 "$dir"
    read -r NODE1_PG_PORT NODE2_PG_PORT NODE1_API_PORT NODE2_API_PORT NODE1_RAFT_PORT NODE2_RAFT_PORT \
      WITNESS_RAFT_PORT < <(free_ports 7)
    for v in NODE1_PG_PORT NODE2_PG_PORT NODE1_API_PORT NODE2_API_PORT NODE1_RAFT_PORT NODE2_RAFT_PORT \
      WITNESS_RAFT_PORT; do echo "$v=${!v}"; done >"$dir/env"
    echo "PATRONI_VENV=$venv" >>"$dir/env"
    write_node_config node1
    write_node_config node2
    cat >"$dir/witness.yml" <<YAML
raft:
  data_dir: '$dir/witness'
  self_addr: 127.0.0.1:$WITNESS_RAFT_PORT
  partner_addrs: ['127.0.0.1:$NODE1_RAFT_PORT', '127.0.0.1:$NODE2_RAFT_PORT']
YAML
    launch witness patroni_raft_controller
    launch node1 patroni
    launch node2 patroni
    # One node bootstraps (initdb), the other copies it (pg_basebackup) and becomes the sync standby.
    wait_for 90 "a leader with a streaming synchronous replica" has_sync_replica
    leader=$(leader_node)
    for db in template1 postgres; do
      sql "$leader" "$db" "$revoke_from_public" >&2
    done
    # pg_rewind asks its source for pg_current_wal_insert_lsn() (in the database postgres, as the
    # rewind user, to whom Patroni granted only pg_ls_dir, pg_stat_file, pg_read_binary_file).
    sql "$leader" postgres "GRANT EXECUTE ON FUNCTION pg_current_wal_insert_lsn() TO rewinder" >&2
    sql "$leader" postgres "CREATE ROLE orderly LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" >&2
    sql "$leader" postgres "CREATE DATABASE orderly OWNER orderly" >&2
    echo "postgresql://orderly@127.0.0.1:$NODE1_PG_PORT,127.0.0.1:$NODE2_PG_PORT/orderly?target_session_attrs=read-write"
    ;;
  superuser-url)
    echo "postgresql://postgres@127.0.0.1:$NODE1_PG_PORT,127.0.0.1:$NODE2_PG_PORT/postgres?target_session_attrs=read-write"
    ;;
  leader)
    leader_node || { echo "no leader" >&2; exit 1; }
    ;;
  switchover)
    leader=$(leader_node) || { echo "no leader" >&2; exit 1; }
    candidate=$(other "$leader")
    # Only the synchronous standby may take over in synchronous_mode.
    wait_for 60 "$candidate to be a synchronous replica" sync_replica "$candidate"
    out=$(timeout 60 "$venv/bin/patronictl" -c "$dir/node1.yml" switchover --leader "$leader" \
      --candidate "$candidate" --force 2>&1) || { echo "$out" >&2; exit 1; }
    echo "$out" >&2
    # patronictl exits 0 when the leader refuses (e.g. "412, candidate name does not match").
    ! grep -q 'Switchover failed' <<<"$out" || exit 1
    wait_for 60 "$candidate to lead and accept writes" leading_and_writable "$candidate"
    ;;
  kill-leader)
    leader=$(leader_node) || { echo "no leader" >&2; exit 1; }
    # A failover needs a synchronous standby to promote (just after a switchover or a rejoin the
    # old leader may still be catching up): wait for one, then lose the machine.
    wait_for 60 "a synchronous replica of $leader" sync_replica "$(other "$leader")"
    pids=$(own_pid "$leader" || true)
    if pm=$(postmaster_pid "$leader"); then
      # Its children are sessions of their own (PostgreSQL calls setsid): list them before the
      # kill reparents them.
      pids="$pids $pm $(pgrep -P "$pm" | tr '\n' ' ')"
    fi
    # shellcheck disable=SC2086
    kill -KILL $pids
    echo "$leader"
    ;;
  wait-leader)
    wait_for 60 "$node to lead and accept writes" leading_and_writable "$node"
    ;;
  restart-node)
    ! own_pid "$node" >/dev/null || { echo "$node's Patroni is running" >&2; exit 1; }
    # wait-replica reads the log from here on.
    stat -c %s "$dir/$node.log" >"$dir/$node.log-offset"
    launch "$node" patroni
    ;;
  wait-replica)
    wait_for 90 "$node to stream synchronously from the leader" sync_replica "$node"
    since=$(cat "$dir/$node.log-offset" 2>/dev/null || echo 0)
    if tail -c +"$((since + 1))" "$dir/$node.log" | grep 'running pg_rewind from' >/dev/null; then
      echo "$node rejoined as a synchronous replica through pg_rewind"
    else
      echo "$node rejoined as a synchronous replica without pg_rewind"
    fi
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    # Patroni stops its PostgreSQL on SIGTERM; the witness goes last so that the raft majority
    # holds while the nodes shut down.
    for n in node1 node2; do
      pid=$(own_pid "$n") && kill -TERM "$pid" || true
    done
    wait_for 30 "Patroni to stop" eval '! own_pid node1 >/dev/null && ! own_pid node2 >/dev/null' || true
    for n in node1 node2; do
      pid=$(own_pid "$n") && kill -KILL "$pid" || true
      if postmaster_pid "$n" >/dev/null; then # a killed Patroni leaves its PostgreSQL running
        runuser -u postgres -- "$bindir/pg_ctl" -D "$dir/$n/data" -m immediate -w -t 10 stop >&2 || true
        pm=$(postmaster_pid "$n") && kill -KILL "$pm" $(pgrep -P "$pm") || true
      fi
    done
    if pid=$(own_pid witness); then
      kill -TERM "$pid" || true
      wait_for 10 "the witness to stop" eval '! own_pid witness >/dev/null' || kill -KILL "$pid" || true
    fi
    # The runuser parents and a postmaster's last moments: gone before DIR is.
    wait_for 10 "the processes of $dir to end" eval '! ours_left' || true
    rm -rf "$dir"
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
