#!/usr/bin/env python3
"""Exit 0 if this machine lets a process read a child's memory with
process_vm_readv (Linux cross-memory attach), which Open MPI's shared-memory
transport uses for large messages. Containers often forbid it (seccomp,
ptrace rules); then loomrun tells Open MPI not to use it."""
import ctypes
import os
import sys


class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    src = ctypes.create_string_buffer(b"loom-cma", 16)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child holds src until it is killed
        os.close(r)
        os.write(w, b"x")
        os.pause()
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    dst = ctypes.create_string_buffer(16)
    local = iovec(ctypes.cast(dst, ctypes.c_void_p), 8)
    remote = iovec(ctypes.cast(src, ctypes.c_void_p), 8)
    n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return 0 if n == 8 and dst.raw[:8] == b"loom-cma" else 1


if __name__ == "__main__":
    sys.exit(main())
