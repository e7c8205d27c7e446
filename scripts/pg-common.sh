# shellcheck shell=bash
# Sourced by pg-cluster.sh and patroni.sh: sets `bindir` to the PostgreSQL server binaries
# (/usr/lib/postgresql/*/bin), installing Debian's postgresql when there are none, and
# `revoke_from_public`: what both run in template1 and postgres to harden a cluster as production
# runs it (the pg_control_* and WAL-inspection functions not executable by PUBLIC).

pg_bin_dir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

if ! bindir=$(pg_bin_dir); then
  echo "installing Debian's postgresql" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  bindir=$(pg_bin_dir) || { echo "no PostgreSQL server binaries after the install" >&2; exit 1; }
fi

# shellcheck disable=SC2034  # read by the scripts that source this file
revoke_from_public="
  REVOKE EXECUTE ON FUNCTION pg_control_system(), pg_control_checkpoint(),
    pg_control_recovery(), pg_control_init(), pg_current_wal_lsn(),
    pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn(), pg_walfile_name(pg_lsn),
    pg_walfile_name_offset(pg_lsn), pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn(),
    pg_wal_lsn_diff(pg_lsn, pg_lsn)
  FROM PUBLIC"
