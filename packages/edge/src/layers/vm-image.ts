// The full VM's disk image: a Debian root made by mmdebstrap (kernel, systemd, the QEMU guest
// agent, chronus as a systemd service on virtio-serial ports), laid out as a GPT disk with an
// EFI system partition (systemd-boot + the kernel) and an ext4 root, converted to qcow2. No loop
// mount anywhere: the root file system is made with `mkfs.ext4 -d`, the ESP with mkfs.vfat and
// mtools, the partition table with sfdisk on the disk file, partitions written in with dd.
// Built once per input into a machine-wide cache.
import { createHash } from 'node:crypto';
import { appendFile, chmod, chown, mkdir, open, readdir, readFile, rename, stat, symlink, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { DsecError } from '@dsec/protocol';
import { buildDebianTree, DEFAULT_DEBIAN_SUITE } from './debian.js';
import { runTool } from './erofs.js';
import { mountsUnder, MNT, umount } from '../sys/linux.js';
import { inCacheScratch } from './machine-cache.js';
import { AGENT_PORTS } from '../backends/microvm/guest.js';

/** Machine-wide cache of built VM disk images. */
export const DEFAULT_VM_CACHE = '/var/cache/dsec/vm';
/** Packages every VM image has (beside `--variant=minbase`). */
export const VM_IMAGE_PACKAGES = ['systemd', 'systemd-sysv', 'udev', 'kmod', 'qemu-guest-agent', 'linux-image-cloud-amd64', 'systemd-boot-efi', 'iproute2'];
/**
 * The desktop image's packages instead of the cloud kernel: Debian's generic kernel (its
 * framebuffer and the bochs DRM driver draw on QEMU's VGA; the cloud kernel has no display
 * driver at all), an initramfs (virtio-blk and ext4 are modules there), Xorg with the
 * modesetting driver and libinput, twm and xterm, X's bitmap fonts, and a browser (Debian's
 * chromium, started by {@link VM_DESKTOP_BROWSER}) with a scalable font for the pages it shows.
 */
export const VM_DESKTOP_PACKAGES = [
  'linux-image-amd64',
  'initramfs-tools',
  'xserver-xorg-core',
  'xserver-xorg-input-libinput',
  'xserver-xorg-legacy',
  'xinit',
  'twm',
  'xterm',
  'xfonts-base',
  'x11-xserver-utils',
  'chromium',
  'fonts-dejavu-core',
];
/**
 * The desktop's browser command: chromium for the logged-in user, software-drawn (the VGA has no
 * GPU), without first-run dialogs or a keyring prompt; its arguments (URLs) are passed on. An
 * agent starts it from the xterm (`browser https://example.org &`). Under TCG (the guest sees
 * `systemd-detect-virt` = `qemu`) chromium runs as one process (`--single-process --no-zygote --no-sandbox`: chromium
 * refuses the first two without the third, and one process has no sandbox of its own): its helper
 * processes do not connect to the browser within the 15 s chromium allows them, and are ended.
 */
export const VM_DESKTOP_BROWSER = '/usr/local/bin/browser';
/** The user a desktop image logs in automatically (the session's processes run as it). */
export const VM_DESKTOP_USER = 'user';
/** Modules the desktop image's initramfs holds (MODULES=list): the root disk and the display. */
const DESKTOP_INITRAMFS_MODULES = ['virtio_pci', 'virtio_blk', 'ext4', 'bochs'];
/** Bumped whenever the recipe below changes what an image holds (part of the cache key). */
const RECIPE_VERSION = 4;
/** Partition UUID of the root file system (the boot entry names it). */
export const ROOT_PARTUUID = '8b6d7365-6376-4d00-8000-64736563726f';
const ESP_PARTUUID = '8b6d7365-6376-4d00-8000-647365636573';
/** Size of the EFI system partition. */
const ESP_MIB = 48;
/**
 * Free room in the root file system beyond the files. Small, so the image (and a raw export of
 * it) stays small: at boot systemd-repart grows the root partition to the end of the sandbox's
 * disk (its overlay is diskMiB) and systemd-growfs grows the file system.
 */
const ROOT_FREE_MIB = 256;
/** Where chronus lives in the guest. */
export const GUEST_AGENT_PATH = '/usr/local/sbin/dsec-chronus';
/** Kernel arguments of the boot entry. */
export const VM_KERNEL_CMDLINE = `root=PARTUUID=${ROOT_PARTUUID} rw rootfstype=ext4 console=ttyS0 quiet loglevel=3 fsck.mode=skip systemd.show_status=0 mitigations=off`;
/** The desktop image's: the same, the initramfs told not to wait for a resume device. */
export const VM_DESKTOP_KERNEL_CMDLINE = `${VM_KERNEL_CMDLINE} noresume`;
/** Units masked: nothing that waits for a terminal or runs periodic maintenance in a sandbox. */
const MASKED_UNITS = [
  'getty@.service',
  'serial-getty@.service',
  'getty.target',
  'console-getty.service',
  'apt-daily.timer',
  'apt-daily-upgrade.timer',
  'e2scrub_all.timer',
  'e2scrub_reap.service',
  'fstrim.timer',
  'dpkg-db-backup.timer',
  'systemd-tmpfiles-clean.timer',
  'systemd-journal-catalog-update.service',
  'systemd-update-done.service',
  'ldconfig.service',
  'systemd-hwdb-update.service',
  'systemd-firstboot.service',
  'systemd-pcrphase-sysinit.service',
  'systemd-pcrphase.service',
];

/** Options of {@link buildVmImage}. */
export interface VmImageOptions {
  /** Cache directory. Default {@link DEFAULT_VM_CACHE}. */
  cacheDir?: string | undefined;
  /** Host path of the static chronus binary installed in the image. */
  agentBinary: string;
  /** Debian suite. Default bookworm. */
  suite?: string;
  /** Packages beyond {@link VM_IMAGE_PACKAGES}. */
  packages?: string[];
  /**
   * A desktop image: the generic kernel with an initramfs and a virtio-blk root (migratable, so
   * such a VM may pause with its memory in a file), Xorg + twm + xterm logged in as
   * {@link VM_DESKTOP_USER} on the VGA screen.
   */
  desktop?: boolean;
  signal?: AbortSignal | undefined;
  onProgress?: ((line: string) => void) | undefined;
}

/** The qcow2 disk image for these inputs: from the cache, or built (minutes) and cached. */
export async function buildVmImage(o: VmImageOptions): Promise<string> {
  const cacheDir = o.cacheDir ?? DEFAULT_VM_CACHE;
  const suite = o.suite ?? DEFAULT_DEBIAN_SUITE;
  const desktop = o.desktop === true;
  const base = desktop ? [...VM_IMAGE_PACKAGES.filter((p) => p !== 'linux-image-cloud-amd64'), ...VM_DESKTOP_PACKAGES] : VM_IMAGE_PACKAGES;
  const packages = [...new Set([...base, ...(o.packages ?? [])])].sort();
  const cmdline = desktop ? VM_DESKTOP_KERNEL_CMDLINE : VM_KERNEL_CMDLINE;
  const progress = o.onProgress ?? (() => undefined);
  const agent = await readFile(o.agentBinary);
  const key = createHash('sha256')
    .update(
      JSON.stringify({
        RECIPE_VERSION,
        suite,
        packages,
        cmdline,
        masked: MASKED_UNITS,
        ...(desktop ? { desktop: DESKTOP_RECIPE_VERSION, modules: DESKTOP_INITRAMFS_MODULES } : {}),
      }),
    )
    .update(agent)
    .digest('hex')
    .slice(0, 24);
  const out = path.join(cacheDir, `${desktop ? 'desktop' : 'image'}-${key}.qcow2`);
  if (await exists(out)) {
    progress(`vm image ${out} (cached)`);
    return out;
  }
  // The scratch directory and its cleanup (also of builds a killed process left) are the
  // machine cache's; the image keeps its own name in the cache, keyed by its inputs.
  return inCacheScratch(cacheDir, 'vm', 0o755, async (work) => {
    const root = path.join(work, 'root');
    progress(`building the ${desktop ? 'desktop ' : ''}VM image (${packages.length} packages of ${suite}; minutes)`);
    await buildDebianTree(root, {
      suite,
      packages,
      variant: 'minbase',
      signal: o.signal,
      onProgress: progress,
      extraArgs: [
        ...['/usr/share/man/*', '/usr/share/doc/*', '/usr/share/locale/*', '/usr/share/info/*', '/usr/share/lintian/*'].map(
          (p) => `--dpkgopt=path-exclude=${p}`,
        ),
        ...(desktop
          ? [
              // Before the kernel's package runs update-initramfs: only the modules listed.
              `--essential-hook=mkdir -p "$1"/etc/initramfs-tools && printf '%s\\n' ${DESKTOP_INITRAMFS_MODULES.join(' ')} > "$1"/etc/initramfs-tools/modules`,
              `--essential-hook=mkdir -p "$1"/etc/initramfs-tools/conf.d && printf 'MODULES=list\\nCOMPRESS=gzip\\nRESUME=none\\n' > "$1"/etc/initramfs-tools/conf.d/dsec.conf`,
            ]
          : // The kernel boots without an initramfs (NVMe and ext4 are built into the cloud kernel).
            ['--customize-hook=rm -f "$1"/boot/initrd.img* "$1"/initrd.img*']),
      ],
    });
    for (const m of await mountsUnder(root)) umount(m, MNT.DETACH);
    o.signal?.throwIfAborted();
    const kernel = await configureRoot(root, agent);
    if (desktop) await configureDesktop(root);
    const esp = path.join(work, 'esp.img');
    await makeEsp(esp, kernel, work, cmdline, o.signal);
    const rootImg = path.join(work, 'root.img');
    const rootBytes = (await duBytes(root)) + ROOT_FREE_MIB * MiB;
    const rootMiB = Math.ceil(rootBytes / MiB);
    progress(`mkfs.ext4 -d: root file system of ${rootMiB} MiB`);
    await runTool(
      'mkfs.ext4',
      ['-q', '-F', '-d', root, '-L', 'dsec-root', '-m', '0', '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', '-b', '4096', rootImg, `${rootMiB}M`],
      o.signal,
    );
    const raw = path.join(work, 'disk.raw');
    await assembleDisk(raw, esp, rootImg, o.signal);
    progress('qemu-img convert: raw -> qcow2');
    const qcow = path.join(work, 'disk.qcow2');
    await runTool('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, qcow], o.signal);
    await chmod(qcow, 0o644);
    await rename(qcow, out);
    progress(`vm image ${out}`);
    return out;
  });
}

const MiB = 1024 * 1024;

/** Installs chronus and its unit, masks what a sandbox does not need; returns the kernel's path. */
async function configureRoot(root: string, agent: Buffer): Promise<string> {
  const at = (p: string) => path.join(root, p);
  await mkdir(path.dirname(at(GUEST_AGENT_PATH)), { recursive: true });
  await writeFile(at(GUEST_AGENT_PATH), agent, { mode: 0o755 });
  const devices = Array.from({ length: AGENT_PORTS }, (_, i) => `dev-virtio\\x2dports-dsec.agent${i}.device`);
  const ports = Array.from({ length: AGENT_PORTS }, (_, i) => `--stream-path /dev/virtio-ports/dsec.agent${i}`).join(' ');
  // Early: no default dependencies, only the agent ports' devices (udev names them).
  await writeFile(
    at('etc/systemd/system/dsec-chronus.service'),
    [
      '[Unit]',
      'Description=dsec agent (chronus) on virtio-serial',
      'DefaultDependencies=no',
      `Wants=${devices.join(' ')}`,
      `After=${devices.join(' ')} systemd-remount-fs.service`,
      '',
      '[Service]',
      `ExecStart=${GUEST_AGENT_PATH} ${ports}`,
      'Restart=always',
      'RestartSec=200ms',
      'KillMode=process',
      'OOMScoreAdjust=-900',
      '',
      '[Install]',
      'WantedBy=sysinit.target',
      '',
    ].join('\n'),
  );
  await mkdir(at('etc/systemd/system/sysinit.target.wants'), { recursive: true });
  await symlink('/etc/systemd/system/dsec-chronus.service', at('etc/systemd/system/sysinit.target.wants/dsec-chronus.service'));
  for (const unit of MASKED_UNITS) {
    await unlink(at(`etc/systemd/system/${unit}`)).catch(() => undefined);
    await symlink('/dev/null', at(`etc/systemd/system/${unit}`));
  }
  await writeFile(at('etc/fstab'), `PARTUUID=${ROOT_PARTUUID} / ext4 rw,noatime,x-systemd.growfs 0 1\n`);
  await mkdir(at('etc/repart.d'), { recursive: true });
  await writeFile(at('etc/repart.d/50-root.conf'), '[Partition]\nType=root-x86-64\n');
  await writeFile(at('etc/hostname'), 'dsec-vm\n');
  await writeFile(at('etc/hosts'), '127.0.0.1 localhost\n127.0.1.1 dsec-vm\n');
  // A machine id per boot (systemd makes one when the file is empty).
  await writeFile(at('etc/machine-id'), '');
  await mkdir(at('etc/systemd/journald.conf.d'), { recursive: true });
  await writeFile(at('etc/systemd/journald.conf.d/dsec.conf'), '[Journal]\nStorage=volatile\nRuntimeMaxUse=8M\n');
  const boot = await readdir(at('boot'));
  const vmlinuz = boot.find((f) => f.startsWith('vmlinuz-'));
  if (!vmlinuz) throw new DsecError('BACKEND_FAILED', 'the VM image has no kernel in /boot');
  return at(`boot/${vmlinuz}`);
}

/** Bumped whenever {@link configureDesktop} changes (part of a desktop image's cache key). */
const DESKTOP_RECIPE_VERSION = 4;

/**
 * The desktop: `dsec-desktop.service` starts X on the VGA screen as {@link VM_DESKTOP_USER}
 * (xinit through Xorg's setuid wrapper, any user allowed), twm and one xterm at a fixed place
 * (600x416 pixels at 16,16); bochs-drm is in the initramfs, so X finds its DRM device at once.
 */
async function configureDesktop(root: string): Promise<void> {
  const at = (p: string) => path.join(root, p);
  const user = VM_DESKTOP_USER;
  // The user (uid 1000) and its home, written as the files useradd would write.
  await appendFile(at('etc/passwd'), `${user}:x:1000:1000:desktop:/home/${user}:/bin/bash\n`);
  await appendFile(at('etc/group'), `${user}:x:1000:\n`);
  await appendFile(at('etc/shadow'), `${user}:!:19000:0:99999:7:::\n`);
  await mkdir(at(`home/${user}`), { recursive: true, mode: 0o755 });
  await chown(at(`home/${user}`), 1000, 1000);
  for (const g of ['video', 'input', 'tty']) await addToGroup(at('etc/group'), g, user);
  await mkdir(at('etc/X11'), { recursive: true });
  await writeFile(at('etc/X11/Xwrapper.config'), 'allowed_users=anybody\nneeds_root_rights=yes\n');
  await mkdir(at('etc/dsec'), { recursive: true });
  await writeFile(
    at('etc/dsec/xinitrc'),
    [
      '#!/bin/sh',
      'xsetroot -solid "#3a6ea5"',
      'xset s off -dpms',
      'twm -f /etc/dsec/twmrc &',
      `cd /home/${user}`,
      'exec xterm -geometry 100x32+16+16 -fn fixed -bg white -fg black -title dsec',
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  await writeFile(
    at('etc/dsec/twmrc'),
    [
      'RandomPlacement',
      'UsePPosition "on"',
      'NoGrabServer',
      'DecorateTransients',
      'Color { BorderColor "slategrey" TitleBackground "slategrey" TitleForeground "white" }',
      '',
    ].join('\n'),
  );
  await writeFile(
    at('etc/systemd/system/dsec-desktop.service'),
    [
      '[Unit]',
      'Description=dsec desktop (X on the VGA screen, twm, xterm)',
      'After=systemd-user-sessions.service systemd-udev-settle.service',
      '',
      '[Service]',
      `User=${user}`,
      `WorkingDirectory=/home/${user}`,
      `Environment=HOME=/home/${user}`,
      'ExecStart=/usr/bin/xinit /etc/dsec/xinitrc -- /usr/bin/Xorg :0 vt7 -nolisten tcp -keeptty -novtswitch',
      'Restart=always',
      'RestartSec=1s',
      'StandardInput=null',
      '',
      '[Install]',
      'WantedBy=multi-user.target',
      '',
    ].join('\n'),
  );
  await mkdir(path.dirname(at(VM_DESKTOP_BROWSER)), { recursive: true });
  await writeFile(
    at(VM_DESKTOP_BROWSER),
    [
      '#!/bin/sh',
      "# The desktop's browser (dsec): chromium drawn in software on the VGA screen.",
      'export DISPLAY="${DISPLAY:-:0}"',
      "# Without hardware virtualisation (QEMU TCG) each of chromium's helper processes takes longer than",
      '# the 15 s it is given to connect to the browser process: they end, are started again, and no page',
      '# ever loads. There everything runs in one process (which has no sandbox of its own).',
      'one=""',
      '[ "$(systemd-detect-virt 2>/dev/null)" = qemu ] && one="--single-process --no-zygote --no-sandbox"',
      'exec /usr/bin/chromium $one --no-first-run --no-default-browser-check --disable-gpu --disable-features=Translate,MediaRouter \\',
      '  --password-store=basic --disable-background-networking --start-maximized --window-position=0,0 "$@"',
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  await mkdir(at('etc/systemd/system/multi-user.target.wants'), { recursive: true });
  await symlink('/etc/systemd/system/dsec-desktop.service', at('etc/systemd/system/multi-user.target.wants/dsec-desktop.service'));
  // The kernel's package made the initramfs in /boot (update-initramfs); makeEsp copies it beside the kernel.
  const boot = await readdir(at('boot'));
  if (!boot.some((f) => f.startsWith('initrd.img-'))) throw new DsecError('BACKEND_FAILED', 'the desktop image has no initramfs in /boot');
}

async function addToGroup(groupFile: string, group: string, user: string): Promise<void> {
  const lines = (await readFile(groupFile, 'utf8')).split('\n').map((l) => {
    const f = l.split(':');
    if (f[0] !== group || f.length < 4) return l;
    const members = f[3] ? f[3].split(',') : [];
    return [...f.slice(0, 3), [...members, user].join(',')].join(':');
  });
  await writeFile(groupFile, lines.join('\n'));
}

/** The EFI system partition: systemd-boot as the removable-media loader, one entry, the kernel (and its initramfs when there is one). */
async function makeEsp(file: string, kernel: string, work: string, cmdline: string, signal?: AbortSignal): Promise<void> {
  const root = path.dirname(path.dirname(kernel));
  const loader = path.join(root, 'usr/lib/systemd/boot/efi/systemd-bootx64.efi');
  if (!(await exists(loader))) throw new DsecError('BACKEND_FAILED', 'the VM image has no systemd-boot (systemd-boot-efi)');
  await runTool('mkfs.vfat', ['-F', '32', '-n', 'ESP', '-C', file, String(ESP_MIB * 1024)], signal);
  const conf = path.join(work, 'loader.conf');
  await writeFile(conf, 'timeout 0\ndefault dsec.conf\nconsole-mode keep\neditor no\n');
  const initrd = path.join(path.dirname(kernel), path.basename(kernel).replace(/^vmlinuz-/, 'initrd.img-'));
  const hasInitrd = await exists(initrd);
  const entry = path.join(work, 'dsec.conf');
  await writeFile(entry, `title dsec\nlinux /vmlinuz\n${hasInitrd ? 'initrd /initrd.img\n' : ''}options ${cmdline}\n`);
  const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
  const m = (cmd: string, args: string[]) => runTool(cmd, ['-i', file, ...args], signal, undefined, env);
  await m('mmd', ['::/EFI', '::/EFI/BOOT', '::/loader', '::/loader/entries']);
  await m('mcopy', [loader, '::/EFI/BOOT/BOOTX64.EFI']);
  await m('mcopy', [conf, '::/loader/loader.conf']);
  await m('mcopy', [entry, '::/loader/entries/dsec.conf']);
  await m('mcopy', [kernel, '::/vmlinuz']);
  if (hasInitrd) await m('mcopy', [initrd, '::/initrd.img']);
}

/** A GPT disk of the ESP and the root partition (sfdisk on the file; partitions copied in with dd). */
async function assembleDisk(raw: string, esp: string, rootImg: string, signal?: AbortSignal): Promise<void> {
  const sector = 512;
  const espSectors = (await stat(esp)).size / sector;
  const rootSectors = (await stat(rootImg)).size / sector;
  const espStart = 2048;
  const rootStart = espStart + espSectors;
  // 1 MiB at the end for the backup GPT.
  const total = (rootStart + rootSectors + 2048) * sector;
  await writeFile(raw, '');
  await runTool('truncate', ['-s', String(total), raw], signal);
  const script = [
    'label: gpt',
    'unit: sectors',
    `start=${espStart}, size=${espSectors}, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, uuid=${ESP_PARTUUID}, name="esp"`,
    `start=${rootStart}, size=${rootSectors}, type=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, uuid=${ROOT_PARTUUID}, name="root"`,
    '',
  ].join('\n');
  const sfdisk = path.join(path.dirname(raw), 'gpt.sfdisk');
  await writeFile(sfdisk, script);
  await runTool('sh', ['-c', 'sfdisk --no-reread --no-tell-kernel -q "$1" < "$2"', 'sfdisk', raw, sfdisk], signal);
  for (const [img, start] of [
    [esp, espStart],
    [rootImg, rootStart],
  ] as const) {
    await runTool('dd', [`if=${img}`, `of=${raw}`, 'bs=1M', `seek=${start * sector}`, 'oflag=seek_bytes', 'conv=notrunc,sparse', 'status=none'], signal);
  }
}

async function duBytes(dir: string): Promise<number> {
  const { stdout } = await runTool('du', ['-sb', '--apparent-size', dir]);
  return Number(stdout.split('\t')[0]) * 1.15;
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}

/** Largest virtual size of an imported disk image. */
export const MAX_IMPORT_VIRTUAL_BYTES = 256 * 1024 * MiB;

/** What {@link importDiskImage} found out about the file. */
export interface DiskImageFacts {
  /** Formats an imported disk may have. */
  format: 'qcow2' | 'raw';
  virtualBytes: number;
}

/** Bytes of an upload read to tell its format (the qcow2 header's fixed part is 104). */
const HEAD_BYTES = 512;
/** Magic bytes of disk formats QEMU knows that may name other files (refused, never guessed). */
const OTHER_FORMAT_MAGICS: readonly [string, number, Buffer][] = [
  ['vmdk', 0, Buffer.from('KDMV', 'latin1')],
  ['vmdk (descriptor)', 0, Buffer.from('# Disk DescriptorFile', 'latin1')],
  ['vhdx', 0, Buffer.from('vhdxfile', 'latin1')],
  ['vpc', 0, Buffer.from('conectix', 'latin1')],
  ['qed', 0, Buffer.from('QED\0', 'latin1')],
  ['vdi', 64, Buffer.from([0x7f, 0x10, 0xda, 0xbe])],
];
/** qcow2 v3 incompatible feature bit: the guest data lives in an external file. */
const QCOW2_EXTERNAL_DATA_FILE = 1n << 2n;
/**
 * Limits of `qemu-img` on an uploaded image (prlimit): crafted headers with huge tables make it
 * allocate gigabytes and spin for minutes (OSSA-2015-014). `info` only reads headers; `convert`
 * copies up to 256 GiB, which needs more CPU time but no more memory.
 */
const QEMU_IMG_INFO_LIMITS = ['--as=1073741824', '--cpu=30'];
const QEMU_IMG_CONVERT_LIMITS = ['--as=2147483648', '--cpu=1800'];

/** The format of an upload from its first bytes: qcow2 by its magic, a refused format, else raw. */
export function diskFormatOf(head: Buffer): { format: DiskImageFacts['format'] } | { refused: string } {
  if (head.subarray(0, 4).equals(Buffer.from('QFI\xfb', 'latin1'))) {
    if (head.length < 80) return { refused: 'a truncated qcow2 header' };
    // Both would make QEMU open a host path the image names; refused before qemu-img reads it.
    if (head.readBigUInt64BE(8) !== 0n) return { refused: 'a qcow2 image with a backing file (it would name a host path)' };
    if (head.readUInt32BE(4) >= 3 && (head.readBigUInt64BE(72) & QCOW2_EXTERNAL_DATA_FILE) !== 0n)
      return { refused: 'a qcow2 image with an external data file (it would name a host path)' };
    return { format: 'qcow2' };
  }
  for (const [name, at, magic] of OTHER_FORMAT_MAGICS)
    if (head.subarray(at, at + magic.length).equals(magic)) return { refused: `a ${name} image (only qcow2 or raw)` };
  return { format: 'raw' };
}

/**
 * Validates an uploaded disk image (qcow2 or raw, size bounds, no backing or external data file:
 * either would make QEMU open a host path the image names) and converts it to a standalone qcow2
 * at `out`. The format comes from the magic bytes and is passed to qemu-img as `-f`, so it never
 * probes (a probed VMDK descriptor opens the files it names); qemu-img runs under prlimit.
 */
export async function importDiskImage(file: string, out: string, signal?: AbortSignal): Promise<DiskImageFacts> {
  const bad = (why: string) => new DsecError('INVALID_ARGUMENT', `body: ${why}`, { field: 'body' });
  const head = Buffer.alloc(HEAD_BYTES);
  const fh = await open(file, 'r');
  let read: number;
  try {
    ({ bytesRead: read } = await fh.read(head, 0, HEAD_BYTES, 0));
  } finally {
    await fh.close();
  }
  const found = diskFormatOf(head.subarray(0, read));
  if ('refused' in found) throw bad(`${found.refused} is refused`);
  const { format } = found;
  const { stdout } = await runTool('prlimit', [...QEMU_IMG_INFO_LIMITS, '--', 'qemu-img', 'info', '--output=json', '-f', format, file], signal).catch(
    (err: unknown) => {
      throw bad(`qemu-img cannot read it as ${format}: ${err instanceof Error ? err.message.slice(-300) : String(err)}`);
    },
  );
  const info = JSON.parse(stdout) as {
    'virtual-size'?: number;
    'backing-filename'?: string;
    'format-specific'?: { data?: { 'data-file'?: string } };
  };
  if (info['backing-filename'] !== undefined) throw bad('a qcow2 image with a backing file is refused (it would name a host path)');
  if (info['format-specific']?.data?.['data-file'] !== undefined) throw bad('a qcow2 image with an external data file is refused');
  const virtualBytes = info['virtual-size'] ?? 0;
  if (virtualBytes < MiB || virtualBytes > MAX_IMPORT_VIRTUAL_BYTES)
    throw bad(`the disk's virtual size ${virtualBytes} bytes is outside 1 MiB .. ${MAX_IMPORT_VIRTUAL_BYTES / (1024 * MiB)} GiB`);
  await runTool('prlimit', [...QEMU_IMG_CONVERT_LIMITS, '--', 'qemu-img', 'convert', '-f', format, '-O', 'qcow2', file, out], signal);
  return { format, virtualBytes };
}

/** Writes a disk layer's qcow2 as a raw image (sparse) at `out`. */
export async function exportRawImage(qcow: string, out: string, signal?: AbortSignal): Promise<void> {
  await runTool('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', qcow, out], signal);
}

/** The virtual size of a qcow2 image in bytes. */
export async function virtualBytes(qcow: string): Promise<number> {
  const { stdout } = await runTool('qemu-img', ['info', '--output=json', '-f', 'qcow2', qcow]);
  return (JSON.parse(stdout) as { 'virtual-size': number })['virtual-size'];
}

/** A path as a value in QEMU's option syntax (a comma is written twice). */
function qemuOptValue(p: string): string {
  return p.replace(/,/g, ',,');
}

/**
 * Writes a VM's disk as one standalone qcow2 at `out`: `overlay` (a copy of the VM's qcow2
 * overlay) read over `base` (its image). The overlay was writable by the VM's QEMU, so its header
 * is not trusted: the backing is given on the command line (the file the header names is never
 * opened), an overlay that names an external data file is refused, and so is one whose virtual
 * size is above `maxBytes` (the disk the sandbox was given: a fork must not get a larger one).
 * qemu-img runs under the same limits as for an upload.
 */
export async function flattenOverlay(overlay: string, base: string, out: string, maxBytes: number, signal?: AbortSignal): Promise<void> {
  const head = Buffer.alloc(80);
  const fh = await open(overlay, 'r');
  try {
    await fh.read(head, 0, head.length, 0);
  } finally {
    await fh.close();
  }
  if (!head.subarray(0, 4).equals(Buffer.from('QFI\xfb', 'latin1'))) throw new DsecError('BACKEND_FAILED', `the VM's overlay is not a qcow2 image`);
  if (head.readUInt32BE(4) >= 3 && (head.readBigUInt64BE(72) & QCOW2_EXTERNAL_DATA_FILE) !== 0n)
    throw new DsecError('BACKEND_FAILED', `the VM's overlay names an external data file (refused: it would name a host path)`);
  const virtualSize = head.readBigUInt64BE(24);
  if (virtualSize > BigInt(maxBytes))
    throw new DsecError(
      'BACKEND_FAILED',
      `the VM's overlay has a virtual size of ${virtualSize} bytes, above the sandbox's disk of ${maxBytes} bytes (refused: its header was changed)`,
    );
  const source = [
    'driver=qcow2',
    'file.driver=file',
    `file.filename=${qemuOptValue(overlay)}`,
    'backing.driver=qcow2',
    'backing.file.driver=file',
    `backing.file.filename=${qemuOptValue(base)}`,
  ].join(',');
  await runTool('prlimit', [...QEMU_IMG_CONVERT_LIMITS, '--', 'qemu-img', 'convert', '--image-opts', source, '-O', 'qcow2', out], signal);
}
