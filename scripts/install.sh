#!/usr/bin/env bash
# Installs what dsec needs on a Debian machine (idempotent): Debian packages when run as root,
# npm dependencies, chronus (static C) and the TypeScript build.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(crun erofs-utils busybox-static fuse3 mmdebstrap util-linux iproute2 nftables gcc make libc6-dev podman bubblewrap openssl postgresql docker-registry dpkg-dev qemu-system-x86 qemu-utils ovmf chromium python3-pytest python3-httpx libfuse3-dev pkg-config)
# Full-VM disk images (dsec image build --vm): GPT with sfdisk, the EFI partition with mkfs.vfat and mtools.
DEBIAN_PACKAGES+=(fdisk dosfstools mtools)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "dsec: installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "dsec: missing Debian packages (install them as root): ${missing[*]}" >&2
    exit 1
  fi
fi

if [ ! -d node_modules ] || [ package.json -nt node_modules/.package-lock.json ] || { [ -f package-lock.json ] && [ package-lock.json -nt node_modules/.package-lock.json ]; }; then
  echo "dsec: installing npm dependencies"
  npm install --no-audit --no-fund --loglevel=error
fi

echo "dsec: building chronus and TypeScript"
make -s -C chronus
# The adversarial test suite's attack kit (a static C program put into sandboxes).
make -s -C test/security/attacks
npx tsc -b
# The web dashboard (ui/, served at /ui): bundled by esbuild in about a second, no network.
node ui/build.mjs
