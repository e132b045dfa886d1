export { mount, umount, MS, MNT, mountsUnder, SyscallError } from './sys/linux.js';
