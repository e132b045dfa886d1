// The microVM guest: a kernel from Debian's packages (fetched with `apt-get download`, unpacked
// with `dpkg-deb -x` into a machine-wide cache keyed by the package's version; nothing is
// installed on the host) and an initramfs dsec builds reproducibly (a newc cpio with fixed
// owners and times): busybox for a few lines of init, the virtio modules Debian builds as
// modules, and chronus, which becomes PID 1 once the image's layers are mounted.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';
import { BUSYBOX_PATH } from '../../layers/busybox.js';

const run = promisify(execFile);

/** Default machine-wide cache of guest kernels and initramfs images. */
export const DEFAULT_GUEST_CACHE = '/var/cache/dsec/microvm';
/** Debian's meta package that names the current cloud kernel. */
export const DEFAULT_KERNEL_PACKAGE = 'linux-image-cloud-amd64';

/** Modules the guest needs (with their dependencies, found in the modules themselves). */
export const GUEST_MODULES = ['virtio_mmio', 'virtio_console', 'virtio_blk', 'erofs', 'overlay', 'virtio_net', 'virtio_balloon'] as const;

/** Serial-port names (virtio-serial) the guest's chronus listens on: the first is the edge's main connection. */
export const AGENT_PORTS = 4;

/** A guest kernel unpacked in the cache. */
export interface GuestKernel {
  /** `<package>_<version>`: the cache key. */
  key: string;
  /** Kernel release (`uname -r` in the guest). */
  release: string;
  vmlinuz: string;
  /** Directory of the unpacked modules (`lib/modules/<release>`). */
  modulesDir: string;
}

/** Kernel and initramfs ready to boot. */
export interface GuestImage {
  kernel: GuestKernel;
  initramfs: string;
}

/** Options of {@link prepareGuest}. */
export interface GuestOptions {
  /** Cache directory. Default {@link DEFAULT_GUEST_CACHE}. */
  cacheDir?: string;
  /** Kernel package (a meta package is followed to the image it depends on). Default {@link DEFAULT_KERNEL_PACKAGE}. */
  kernelPackage?: string;
  /** Host path of the static chronus binary. */
  agentBinary: string;
  /** Host path of a static busybox. Default busybox-static's. */
  busybox?: string;
}

/** The kernel (downloaded once per version) and an initramfs for this chronus (built once per input). */
export async function prepareGuest(o: GuestOptions): Promise<GuestImage> {
  const cacheDir = o.cacheDir ?? DEFAULT_GUEST_CACHE;
  await mkdir(cacheDir, { recursive: true, mode: 0o755 });
  const kernel = await guestKernel(cacheDir, o.kernelPackage ?? DEFAULT_KERNEL_PACKAGE);
  const initramfs = await guestInitramfs(cacheDir, kernel, o.agentBinary, o.busybox ?? BUSYBOX_PATH);
  return { kernel, initramfs };
}

/** Resolves the package (following a meta package) to `name` and `version` with apt-cache. */
async function resolvePackage(pkg: string): Promise<{ name: string; version: string }> {
  let name = pkg;
  for (let hop = 0; hop < 3; hop++) {
    const { stdout } = await run('apt-cache', ['show', '--no-all-versions', name], { maxBuffer: 8 << 20 });
    const field = (f: string): string | undefined => new RegExp(`^${f}: (.*)$`, 'm').exec(stdout)?.[1]?.trim();
    const version = field('Version');
    if (!version) throw new DsecError('BACKEND_FAILED', `apt-cache knows no version of ${name}`);
    // A meta package: one dependency on the real image.
    const dep = /^linux-image-\d/.test(name) ? undefined : field('Depends')?.split(',')[0]?.trim().split(' ')[0];
    if (!dep) return { name, version };
    name = dep;
  }
  throw new DsecError('BACKEND_FAILED', `${pkg}: no kernel image package found`);
}

async function guestKernel(cacheDir: string, pkg: string): Promise<GuestKernel> {
  let resolved: { name: string; version: string } | undefined;
  try {
    resolved = await resolvePackage(pkg);
  } catch (err) {
    // No apt here (or no index): any kernel already cached will do.
    const cached = (await readdir(cacheDir).catch(() => [] as string[])).filter((d) => d.startsWith('linux-image-')).sort();
    const last = cached.at(-1);
    if (!last) throw err;
    return kernelAt(cacheDir, last);
  }
  const key = `${resolved.name}_${resolved.version}`;
  const dir = path.join(cacheDir, key);
  if (!(await exists(path.join(dir, 'ready')))) {
    const tmp = await mkdtemp(path.join(cacheDir, '.fetch-'));
    try {
      await run('apt-get', ['download', '-q', `${resolved.name}=${resolved.version}`], { cwd: tmp, maxBuffer: 8 << 20 });
      const deb = (await readdir(tmp)).find((f) => f.endsWith('.deb'));
      if (!deb) throw new DsecError('BACKEND_FAILED', `apt-get download ${resolved.name} wrote no package`);
      const x = path.join(tmp, 'x');
      await run('dpkg-deb', ['-x', path.join(tmp, deb), x]);
      const boot = await readdir(path.join(x, 'boot'));
      const vmlinuz = boot.find((f) => f.startsWith('vmlinuz-'));
      if (!vmlinuz) throw new DsecError('BACKEND_FAILED', `${deb}: no vmlinuz`);
      const release = vmlinuz.slice('vmlinuz-'.length);
      const out = path.join(tmp, 'out');
      await mkdir(out);
      await rename(path.join(x, 'boot', vmlinuz), path.join(out, 'vmlinuz'));
      await rename(path.join(x, 'lib', 'modules', release), path.join(out, 'modules'));
      await writeFile(path.join(out, 'release'), release);
      await writeFile(path.join(out, 'ready'), key);
      await rename(out, dir).catch((err: unknown) => {
        // Another node filled the same key meanwhile.
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw err;
      });
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }
  return kernelAt(cacheDir, key);
}

async function kernelAt(cacheDir: string, key: string): Promise<GuestKernel> {
  const dir = path.join(cacheDir, key);
  const release = (await readFile(path.join(dir, 'release'), 'utf8')).trim();
  return { key, release, vmlinuz: path.join(dir, 'vmlinuz'), modulesDir: path.join(dir, 'modules') };
}

/** The `.ko` files of `names` and everything they depend on, dependencies first. */
export async function moduleOrder(modulesDir: string, names: readonly string[]): Promise<Array<{ name: string; file: string }>> {
  const index = new Map<string, string>();
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.name.endsWith('.ko')) index.set(e.name.slice(0, -3).replace(/-/g, '_'), p);
    }
  };
  await walk(path.join(modulesDir, 'kernel'));
  const order: Array<{ name: string; file: string }> = [];
  const seen = new Set<string>();
  const visit = async (name: string): Promise<void> => {
    if (seen.has(name)) return;
    seen.add(name);
    const file = index.get(name);
    // Not a module: built into the kernel (modules.builtin) or absent.
    if (!file) return;
    for (const dep of modinfoDepends(await readFile(file))) await visit(dep);
    order.push({ name, file });
  };
  for (const n of names) await visit(n);
  return order;
}

/** The `depends=` entry of a module's .modinfo section. */
function modinfoDepends(ko: Buffer): string[] {
  const at = ko.indexOf('\0depends=');
  if (at < 0) return [];
  const start = at + '\0depends='.length;
  const end = ko.indexOf(0, start);
  const list = ko.subarray(start, end).toString('latin1');
  return list ? list.split(',').map((d) => d.replace(/-/g, '_')) : [];
}

/**
 * The guest's /init: mounts what the kernel does not, loads the modules, mounts the image's
 * EROFS layers (virtio-blk disks named by serial: `m<i>` metadata, `b<i>` data blob) under an
 * overlay whose upper directory is on the writable disk (`rw`, ext4 made by the host, bounded by
 * the sandbox's diskMiB), then moves into it and becomes chronus (PID 1) on the agent's ports.
 */
export const GUEST_INIT = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
die() {
  echo "dsec-init: $*" > /dev/console
  for v in /sys/bus/virtio/devices/*; do echo "dsec-init: $v device $(cat $v/device) driver $(readlink $v/driver)"; done > /dev/console
  poweroff -f
}
agent_ports() {
  PORTS=
  # Ports are announced over virtio-serial's control queue, after the driver has loaded.
  n=0
  while [ ! -e /sys/class/virtio-ports/vport0p1 ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  for p in /sys/class/virtio-ports/vport*; do
    case "$(cat $p/name)" in dsec.agent*) PORTS="$PORTS --stream-path /dev/\${p##*/}" ;; esac
  done
  [ -n "$PORTS" ] || die "no agent port"
}
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
LAYERS=0; CAP=4194304; ADDR=; GW=; MMIO=; PROBE=
for a in $(cat /proc/cmdline); do
  case "$a" in
    virtio_mmio.device=*) MMIO="$MMIO device=\${a#*=}" ;;
    dsec.layers=*) LAYERS="\${a#*=}" ;;
    dsec.cap=*) CAP="\${a#*=}" ;;
    dsec.addr=*) ADDR="\${a#*=}" ;;
    dsec.gw=*) GW="\${a#*=}" ;;
    dsec.probe=1) PROBE=1 ;;
  esac
done
# insmod does not read module parameters from the kernel command line (modprobe would).
for m in $(cat /etc/modules); do
  if [ "$m" = virtio_mmio ]; then insmod /lib/modules/$m.ko $MMIO || die "insmod $m"
  else insmod /lib/modules/$m.ko || die "insmod $m"; fi
done
# The node's boot probe: chronus straight from the initramfs, no disks.
if [ -n "$PROBE" ]; then agent_ports; exec /chronus $PORTS; fi
for d in /sys/block/vd*; do
  [ -e "$d/serial" ] || continue
  s=$(cat "$d/serial")
  case "$s" in m[0-9]*|b[0-9]*|rw) eval "DISK_$s=/dev/\${d##*/}" ;; esac
done
LOWER=
i=0
while [ "$i" -lt "$LAYERS" ]; do
  eval "meta=\\$DISK_m$i; blob=\\$DISK_b$i"
  [ -n "$meta" ] || die "layer $i: no disk"
  mkdir -p /layers/$i
  if [ -n "$blob" ]; then opt="ro,device=$blob"; else opt=ro; fi
  mount -t erofs -o "$opt" "$meta" /layers/$i || die "mount layer $i"
  LOWER="/layers/$i\${LOWER:+:$LOWER}"
  i=$((i + 1))
done
[ -n "$DISK_rw" ] || die "no writable disk"
mkdir -p /rw /newroot
mount -t ext4 -o nodev,nosuid "$DISK_rw" /rw || die "mount writable disk"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=/rw/upper,workdir=/rw/work" /newroot || die "overlay"
mkdir -p /newroot/.dsec /newroot/dev /newroot/proc /newroot/sys /newroot/tmp
[ -e /newroot/.dsec/chronus ] || touch /newroot/.dsec/chronus
mount --bind /chronus /newroot/.dsec/chronus
mount -o remount,bind,ro /newroot/.dsec/chronus
[ -e /newroot/.dsec/busybox ] || touch /newroot/.dsec/busybox
mount --bind /bin/busybox /newroot/.dsec/busybox
mount -o remount,bind,ro /newroot/.dsec/busybox
agent_ports
ip link set lo up 2>/dev/null
if [ -n "$ADDR" ] && [ -e /sys/class/net/eth0 ]; then
  ip addr add "$ADDR" dev eth0 && ip link set eth0 up && ip route add default via "$GW" || die "network"
fi
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev shm /newroot/dev/shm
hostname sandbox
exec switch_root /newroot /.dsec/chronus $PORTS --output-cap "$CAP"
`;

/** Builds (once per input) the initramfs: busybox, chronus, the modules, /init. */
async function guestInitramfs(cacheDir: string, kernel: GuestKernel, agentBinary: string, busybox: string): Promise<string> {
  const modules = await moduleOrder(kernel.modulesDir, GUEST_MODULES);
  const files: CpioEntry[] = [
    { name: 'bin', mode: 0o40755 },
    { name: 'bin/busybox', mode: 0o100755, data: await readFile(busybox) },
    { name: 'chronus', mode: 0o100755, data: await readFile(agentBinary) },
    { name: 'dev', mode: 0o40755 },
    { name: 'etc', mode: 0o40755 },
    { name: 'etc/modules', mode: 0o100644, data: Buffer.from(modules.map((m) => m.name).join('\n') + '\n') },
    { name: 'init', mode: 0o100755, data: Buffer.from(GUEST_INIT) },
    { name: 'lib', mode: 0o40755 },
    { name: 'lib/modules', mode: 0o40755 },
    { name: 'proc', mode: 0o40755 },
    { name: 'sys', mode: 0o40755 },
  ];
  for (const m of modules) files.push({ name: `lib/modules/${m.name}.ko`, mode: 0o100644, data: await readFile(m.file) });
  files.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const archive = cpioNewc(files);
  const hash = createHash('sha256').update(archive).digest('hex').slice(0, 24);
  const out = path.join(cacheDir, `initramfs-${kernel.release}-${hash}.cpio`);
  if (!(await exists(out))) {
    const tmp = `${out}.${process.pid}.tmp`;
    await writeFile(tmp, archive, { mode: 0o644 });
    await rename(tmp, out);
  }
  return out;
}

/** One entry of a newc archive. */
export interface CpioEntry {
  name: string;
  /** st_mode with the file type bits. */
  mode: number;
  data?: Buffer;
}

/** A newc ("070701") archive with owner 0, mtime 0 and inode numbers by position: the same input, the same bytes. */
export function cpioNewc(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  const pad4 = (n: number): Buffer => Buffer.alloc((4 - (n % 4)) % 4);
  const header = (ino: number, mode: number, size: number, name: string, nlink: number): Buffer => {
    const hex = (v: number): string => v.toString(16).padStart(8, '0');
    const fields = ['070701', hex(ino), hex(mode), hex(0), hex(0), hex(nlink), hex(0), hex(size), hex(0), hex(0), hex(0), hex(0), hex(name.length + 1), hex(0)];
    const h = Buffer.from(fields.join('') + name + '\0', 'latin1');
    return Buffer.concat([h, pad4(h.length)]);
  };
  entries.forEach((e, i) => {
    const size = e.data?.length ?? 0;
    const isDir = (e.mode & 0o170000) === 0o040000;
    parts.push(header(i + 1, e.mode, size, e.name, isDir ? 2 : 1));
    if (e.data) parts.push(e.data, pad4(e.data.length));
  });
  parts.push(header(0, 0, 0, 'TRAILER!!!', 1));
  return Buffer.concat(parts);
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
