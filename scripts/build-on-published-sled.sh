#!/usr/bin/env bash
# Builds orderly at a commit on sled 0.34.7 as published on crates.io instead of vendor/sled,
# for measuring what the patches cost and keep (scripts/scale.sh with each binary).
#
#   scripts/build-on-published-sled.sh OUT [COMMIT]
#
# OUT is the binary written (COMMIT defaults to HEAD). A detached worktree of COMMIT in a scratch
# folder, the root Cargo.toml's [patch.crates-io] removed, and the one API the patched copy adds
# given back in terms of the published one: `TransactionalTree::set` and `delete`
# (ORDERLY-PATCHES.md, change 6) become `insert` and `remove`, which read the value they replace
# as the published crate always does. Stores are compressed from the commit that made them so,
# and the published crate refuses zstd levels under 1, which the patched copy allows: such a
# commit's level (src/store/sled/compression.rs) becomes 1. The build shares the repository's target directory
# (cargo keeps the two sleds apart); the binary is copied to OUT at once, since both builds
# write target/release/orderly.
set -euo pipefail
out=${1:?usage: build-on-published-sled.sh OUT [COMMIT]}
commit=${2:-HEAD}
repo=$(cd "$(dirname "$0")/.." && pwd)
tree=$(mktemp -d /tmp/orderly-published.XXXXXX)
cleanup() { git -C "$repo" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"; }
trap cleanup EXIT

git -C "$repo" worktree add -q --detach "$tree" "$commit"
cd "$tree"
sed -i '/^\[patch.crates-io\]/,/^sled = { path = "vendor\/sled" }/d' Cargo.toml
! grep -q 'path = "vendor/sled"' Cargo.toml || { echo "Cargo.toml still names vendor/sled" >&2; exit 1; }

if [ -f src/store/sled/compression.rs ]; then
  sed -i 's/^pub(super) const LEVEL: i32 = .*;/pub(super) const LEVEL: i32 = 1;/' src/store/sled/compression.rs
  grep -q '^pub(super) const LEVEL: i32 = 1;' src/store/sled/compression.rs || { echo "compression.rs has no LEVEL to set" >&2; exit 1; }
fi
cat > src/store/sled/published.rs <<'EOF'
//! Built only by scripts/build-on-published-sled.sh: the patched sled's writes that do not read
//! what they replace, as the published crate has them (a read, then the write).
use sled::transaction::TransactionalTree;
use sled::IVec;

pub(super) trait WritesThatRead {
    fn set<K: AsRef<[u8]> + Into<IVec>, V: Into<IVec>>(&self, key: K, value: V);
    fn delete<K: AsRef<[u8]> + Into<IVec>>(&self, key: K);
}

impl WritesThatRead for TransactionalTree {
    fn set<K: AsRef<[u8]> + Into<IVec>, V: Into<IVec>>(&self, key: K, value: V) {
        self.insert(key, value).expect("a read within a transaction");
    }
    fn delete<K: AsRef<[u8]> + Into<IVec>>(&self, key: K) {
        self.remove(key).expect("a read within a transaction");
    }
}
EOF
echo 'mod published;' >> src/store/sled/mod.rs
for f in src/store/sled/*.rs src/store/sled/*/*.rs; do
  case $f in */published.rs | */mod.rs) continue ;; esac
  printf '\n#[allow(unused_imports)]\nuse crate::store::sled::published::WritesThatRead as _;\n' >> "$f"
done

CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target} cargo build --release --bin orderly
cp "${CARGO_TARGET_DIR:-$repo/target}/release/orderly" "$out"
echo "orderly $(git rev-parse --short HEAD) on the published sled: $out"
