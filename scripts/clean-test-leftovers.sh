#!/usr/bin/env bash
# Removes what interrupted test or benchmark runs left behind: their sandboxes (processes and
# cgroups), mounts, runtime namespaces and temp homes. Safe to run at any time; touches only
# dsec's temp homes under /tmp and their runtime dirs under /run/dsec.
set -uo pipefail
shopt -s nullglob

kill_sandboxes() { # crun state root, ns file
  local root=$1 ns=$2 id
  [ -d "$root" ] || return 0
  for id in $(ls "$root"); do
    if [ -e "$ns" ] && nsenter --mount="$ns" true 2>/dev/null; then
      nsenter --mount="$ns" -- crun --root "$root" delete --force "$id" >/dev/null 2>&1
    else
      unshare -m sh -c "umount /sys/fs/cgroup/unified 2>/dev/null; crun --root '$root' delete --force '$id'" >/dev/null 2>&1
    fi
  done
}

unmount_under() {
  local dir=$1
  awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print length($2), $2}' /proc/self/mounts | sort -rn | cut -d' ' -f2- |
    while read -r m; do umount -l "$m" 2>/dev/null; done
}

# A home's sandbox networking: its nftables table (inet dsec_<hash>) and its links (d<hash6>-*:
# the gateway pair and one veth per networked sandbox).
remove_network() { # run-dir hash
  local hash=$1 link
  nft delete table inet "dsec_$hash" 2>/dev/null
  for link in /sys/class/net/d"${hash:0:6}"-*; do
    [ -e "$link" ] && ip link del "$(basename "$link")" 2>/dev/null
  done
}

# Lazy layers' FUSE views (dsec-lazyfs, type fuse.dsec-lazy) under dsec's temp homes: unmounted
# first (their lazy servers exit once the view is gone), before the layer mounts over them go.
awk '$3 == "fuse.dsec-lazy" && index($2, "/tmp/dsec-") == 1 {print $2}' /proc/self/mounts |
  while read -r m; do umount -l "$m" 2>/dev/null; done

for home in /tmp/dsec-test-* /tmp/dsec-platform-*/node /tmp/dsec-bench-* /tmp/dsec-cli-*/node /tmp/dsec-sdk-*/node /tmp/dsec-cluster-*/cp/node /tmp/dsec-cluster-*/edge-*; do
  [ -d "$home" ] || continue
  hash=$(printf '%s' "$home" | sha256sum | cut -c1-12)
  run=/run/dsec/$hash
  kill_sandboxes "$run/crun" "$run/mntns"
  remove_network "$hash"
  unmount_under "$home"
  unmount_under "$run"
  rm -rf "$run"
done
for dir in /tmp/dsec-test-* /tmp/dsec-platform-* /tmp/dsec-bench-* /tmp/dsec-scratch-* /tmp/dsec-cli-* /tmp/dsec-sdk-* /tmp/dsec-cluster-*; do
  unmount_under "$dir"
  rm -rf "$dir"
done
# zram swap devices that an edge set up for paused sandboxes (EdgeOptions.zramSwapMiB, tests,
# the pause benchmark) and did not take down: swap off, reset, and remove the ones it added.
for marker in /run/dsec/zram/zram*; do
  dev=$(basename "$marker")
  swapoff "/dev/$dev" 2>/dev/null
  echo 1 > "/sys/block/$dev/reset" 2>/dev/null
  if grep -q hot-added "$marker"; then echo "${dev#zram}" > /sys/class/zram-control/hot_remove 2>/dev/null; fi
  rm -f "$marker"
done
# Runtime dirs whose home is gone (a node that was removed without shutting down).
for run in /run/dsec/*/; do
  run=${run%/}
  [ "$run" = /run/dsec/idmap ] && continue
  home=$(cat "$run/home" 2>/dev/null || true)
  if [ -z "$home" ] || [ ! -d "$home" ]; then
    kill_sandboxes "$run/crun" "$run/mntns"
    remove_network "$(basename "$run")"
    unmount_under "$run"
    rm -rf "$run"
  fi
done
# User namespace id ranges claimed by nodes whose home is gone (each claim names its home).
for claim in /run/dsec/idmap/*; do
  home=$(head -n1 "$claim" 2>/dev/null || true)
  if [ -z "$home" ] || [ ! -d "$home" ]; then rm -f "$claim"; fi
done
# Network namespaces that network tests create for their upstreams (their veths go with them).
for ns in /run/netns/dsec-test-*; do
  ip netns del "$(basename "$ns")" 2>/dev/null
done
# The bridge test/cluster.test.ts joins its nodes' namespaces to.
ip link del dsec-test-ctbr 2>/dev/null
# Address-slice claims whose home is gone (the home's table and links go with them).
for claim in /run/dsec-net/*/; do
  claim=${claim%/}
  home=$(cat "$claim/home" 2>/dev/null || true)
  if [ -z "$home" ] || [ ! -d "$home" ]; then
    [ -n "$home" ] && remove_network "$(printf '%s' "$home" | sha256sum | cut -c1-12)"
    rm -rf "$claim"
  fi
done
for parent in /sys/fs/cgroup/*/dsec-test-* /sys/fs/cgroup/*/dsec-bench /sys/fs/cgroup/dsec-test-* /sys/fs/cgroup/*/dsec-ct-* /sys/fs/cgroup/dsec-ct-*; do
  for cg in "$parent"/*/; do rmdir "$cg" 2>/dev/null; done
  rmdir "$parent" 2>/dev/null
done
# The state-store tests (test/helpers/postgres.ts, test/replicas.test.ts, test/db-copy.test.ts):
# the PostgreSQL server of each cluster left behind (only one whose command line names that
# data dir) is stopped at once, then its dir goes; the copy test's home held a node.
for home in /tmp/dsec-copy-*/node; do
  hash=$(printf '%s' "$home" | sha256sum | cut -c1-12)
  run=/run/dsec/$hash
  kill_sandboxes "$run/crun" "$run/mntns"
  remove_network "$hash"
  unmount_under "$home"
  unmount_under "$run"
  rm -rf "$run"
done
for dir in /tmp/dsec-pg-*; do
  pid=$(head -n1 "$dir/data/postmaster.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/data"; then
    kill -QUIT "$pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -d "/proc/$pid" ] || break; sleep 0.5; done
  fi
  rm -rf "$dir"
done
for dir in /tmp/dsec-copy-* /tmp/dsec-replica-*; do
  unmount_under "$dir"
  rm -rf "$dir"
done
exit 0
