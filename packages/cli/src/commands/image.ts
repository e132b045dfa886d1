// dsec image build | pull | ls | rm: image layers.
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import type { LayerInfo } from '@dsec/sdk';
import type { LayerKind } from '@dsec/protocol';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatAge, formatBytes, printJson, printTable } from '../output.js';
import { commaList } from '../parse.js';
import { checkUploadSize, minTarBytes } from '../upload-size.js';

/** How often upload progress is printed at most. */
const PROGRESS_INTERVAL_MS = 500;

function progressPrinter(totalBytes?: number): { update(bytes: number): void; done(): void } {
  let last = 0;
  let sent = 0;
  let printed = -1;
  const print = (): void => {
    if (printed === sent) return;
    printed = sent;
    const total = totalBytes ? ` / ${formatBytes(totalBytes)}` : '';
    process.stderr.write(`uploaded ${formatBytes(sent)}${total}\n`);
  };
  return {
    update(bytes) {
      sent = bytes;
      const now = Date.now();
      if (now - last >= PROGRESS_INTERVAL_MS) {
        last = now;
        print();
      }
    },
    done: print,
  };
}

/** Registers `dsec image ...`. */
export function registerImage(program: Command): void {
  const image = program.command('image').alias('layer').description('build, list and remove image layers');

  image
    .command('build')
    .description('build a layer from a directory, a tar, an OCI image or Debian packages, or a bootable VM disk image (--vm)')
    .argument('<name>', 'name[:tag]')
    .option('--kind <kind>', 'base, workspace or toolkit (all but --vm)')
    .option('--vm', 'a bootable VM disk image (Debian, systemd, the QEMU guest agent, chronus) for backend "vm"; --debian adds packages')
    .option('--desktop', 'with --vm: a desktop image (generic kernel, Xorg, twm, an xterm logged in on the screen, chromium)')
    .option('--from-dir <dir>', 'a directory')
    .option('--from-tar <file>', 'a tar (optionally gzip) file')
    .option('--from-oci <file>', 'an OCI layout or docker save tarball (squashed)')
    .option('--debian <pkgs>', 'comma-separated Debian packages (built with mmdebstrap on the server)', commaList)
    .option('--suite <suite>', 'Debian suite for --debian')
    .option('--json', 'print the layer as JSON')
    .action(
      async (
        name: string,
        flags: {
          kind?: string;
          vm?: boolean;
          desktop?: boolean;
          fromDir?: string;
          fromTar?: string;
          fromOci?: string;
          debian?: string[];
          suite?: string;
          json?: boolean;
        },
        cmd: Command,
      ) => {
        if (flags.desktop && !flags.vm) throw new InvalidArgumentError('--desktop goes with --vm');
        if (flags.vm) {
          if (flags.kind !== undefined || flags.fromDir || flags.fromTar || flags.fromOci)
            throw new InvalidArgumentError('--vm takes no --kind and no --from-*');
          const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
          const layer = await client.layers.buildVm(
            {
              name,
              ...(flags.debian ? { packages: flags.debian } : {}),
              ...(flags.suite ? { suite: flags.suite } : {}),
              ...(flags.desktop ? { desktop: true } : {}),
            },
            { onProgress: (message) => process.stderr.write(`${message}\n`) },
          );
          if (flags.json) printJson(layer);
          else process.stdout.write(`${layer.digest}\n`);
          return;
        }
        if (flags.kind === undefined) throw new InvalidArgumentError('--kind is required (base, workspace or toolkit)');
        const sources = [flags.fromDir, flags.fromTar, flags.fromOci, flags.debian].filter((s) => s !== undefined);
        if (sources.length !== 1) throw new InvalidArgumentError('give exactly one of --from-dir, --from-tar, --from-oci, --debian');
        if (flags.suite && !flags.debian) throw new InvalidArgumentError('--suite goes with --debian');
        const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
        const kind = flags.kind as Exclude<LayerKind, 'snapshot' | 'disk'>;
        let layer: LayerInfo;
        if (flags.debian) {
          layer = await client.layers.buildDebian(
            { kind, name, packages: flags.debian, ...(flags.suite ? { suite: flags.suite } : {}) },
            { onProgress: (message) => process.stderr.write(`${message}\n`) },
          );
        } else if (flags.fromDir) {
          if (!(await stat(flags.fromDir)).isDirectory()) throw new InvalidArgumentError(`not a directory: ${flags.fromDir}`);
          checkUploadSize(`${flags.fromDir} as a tar`, await minTarBytes(flags.fromDir));
          const progress = progressPrinter();
          layer = await client.layers.uploadDir(flags.fromDir, { kind, name }, { onProgress: (n) => progress.update(n) });
          progress.done();
        } else {
          const file = (flags.fromTar ?? flags.fromOci) as string;
          const size = (await stat(file)).size;
          checkUploadSize(file, size);
          const progress = progressPrinter(size);
          layer = await client.layers.upload(
            createReadStream(file),
            { kind, name, format: flags.fromOci ? 'oci' : 'tar' },
            { onProgress: (n) => progress.update(n) },
          );
          progress.done();
        }
        if (flags.json) printJson(layer);
        else process.stdout.write(`${layer.digest}\n`);
      },
    );

  image
    .command('import')
    .description('import a qcow2 or raw disk image of any OS as a disk layer (backend "vm"; exec through the QEMU guest agent when it has no chronus)')
    .argument('<file>', 'a .qcow2 or raw disk image')
    .option('--name <name>', 'name[:tag] to give the layer')
    .option('--json', 'print the layer as JSON')
    .action(async (file: string, flags: { name?: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const size = (await stat(file)).size;
      checkUploadSize(file, size, 'a raw image converted to qcow2 (qemu-img convert -O qcow2) keeps only the blocks in use');
      const progress = progressPrinter(size);
      const layer = await client.layers.upload(
        createReadStream(file),
        { format: 'disk', ...(flags.name !== undefined ? { name: flags.name } : {}) },
        { onProgress: (n) => progress.update(n) },
      );
      progress.done();
      if (flags.json) printJson(layer);
      else process.stdout.write(`${layer.digest}\n`);
    });

  image
    .command('export')
    .description('download a disk layer (backend "vm") as a raw disk image (sparse) or as qcow2')
    .argument('<ref>', 'the disk layer: name[:tag] or sha256:...')
    .option('--raw <file>', 'write a raw disk image')
    .option('--qcow2 <file>', 'write the qcow2 image')
    .action(async (ref: string, flags: { raw?: string; qcow2?: string }, cmd: Command) => {
      if ((flags.raw === undefined) === (flags.qcow2 === undefined)) throw new InvalidArgumentError('give one of --raw <file>, --qcow2 <file>');
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const file = (flags.raw ?? flags.qcow2) as string;
      const bytes = await client.layers.exportDisk(ref, file, { format: flags.raw !== undefined ? 'raw' : 'qcow2' });
      process.stderr.write(`${file}: ${bytes} bytes\n`);
    });

  image
    .command('pull')
    .description('import an image from a registry the node pulls from (node.pullFrom), squashed into one layer')
    .argument('<ref>', 'host[:port]/repository[:tag] or host[:port]/repository@sha256:...')
    .option('--name <name>', 'name[:tag] to give the layer')
    .option('--kind <kind>', 'base, workspace or toolkit', 'base')
    .option('--json', 'print the layer as JSON')
    .action(async (ref: string, flags: { name?: string; kind: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const layer = await client.layers.pull(
        { ref, kind: flags.kind as Exclude<LayerKind, 'snapshot' | 'disk'>, ...(flags.name !== undefined ? { name: flags.name } : {}) },
        { onProgress: (message) => process.stderr.write(`${message}\n`) },
      );
      if (flags.json) printJson(layer);
      else process.stdout.write(`${layer.digest}\n`);
    });

  image
    .command('ls')
    .alias('list')
    .description("list layers (the project's and the public ones)")
    .option('--kind <kind>', 'only this kind')
    .option('--json', 'print JSON')
    .action(async (flags: { kind?: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const items = await client.layers.list(flags.kind ? { kind: flags.kind as LayerKind } : {});
      if (flags.json) return printJson(items);
      printTable(
        ['name', 'kind', 'digest', 'size', 'files', 'project', 'age'],
        items.map((l) => [
          l.names.join(',') || '-',
          l.kind,
          l.digest.replace(/^sha256:/, '').slice(0, 12),
          formatBytes(l.contentBytes),
          String(l.files),
          l.project,
          formatAge(l.createdAt),
        ]),
      );
    });

  image
    .command('rm')
    .description('remove a layer (refused while a sandbox uses it)')
    .argument('<ref>', 'name[:tag] or sha256:...')
    .action(async (ref: string, _flags: object, cmd: Command) => {
      await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).layers.remove(ref);
    });
}
