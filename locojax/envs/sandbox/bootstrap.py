"""The sandbox bootstrap: the child side, between fork and exec (see `locojax.envs.sandbox`).

The parent runs this file as a script, `python -I -S -B bootstrap.py SPEC`, before every
sandboxed command: it must stay stdlib-only and import nothing from locojax. The parent
also imports it normally, for the CLONE_* flags.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys

# ---------------------------------------------------------------------------------------------
# The bootstrap: runs as `python -I -S bootstrap.py SPEC`, stdlib only, between fork and exec.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, src, dst, fstype, flags, data=None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def _locked_flags(path: str) -> int:
    """Mount flags a user namespace may not clear on remount (else EPERM)."""
    f = os.statvfs(path).f_flag
    out = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return out | (MS_RELATIME if f & 4096 else 0)  # ST_RELATIME is 4096, MS_RELATIME is not


def _mounts_under(root: str) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if mp.startswith(root + "/"):
                out.append(mp)
    return out


def _build_root(libc, spec: dict) -> None:
    """Fresh tmpfs root with read-only binds of the system, rw work dir, then pivot_root."""
    root, work = spec["newroot"], spec["work"]
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do propagates back
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for p in spec["ro_paths"]:
        dest = root + p
        if os.path.islink(p):  # e.g. /bin -> usr/bin on merged-/usr systems
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if not os.path.lexists(dest):
                os.symlink(os.readlink(p), dest)
            continue
        if not os.path.exists(p) or os.path.exists(dest):
            continue
        if os.path.isdir(p):
            os.makedirs(dest, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            open(dest, "w").close()
        _mount(libc, p, dest, None, MS_BIND | MS_REC)
    for mp in _mounts_under(root):  # every bind (and submount) read-only, no setuid
        _mount(libc, None, mp, None,
               MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | _locked_flags(mp))
    os.makedirs(root + "/dev")
    for name in _DEV_NODES:
        open(f"{root}/dev/{name}", "w").close()
        _mount(libc, f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    if spec["flags"] & CLONE_NEWPID:
        os.makedirs(root + "/proc")
        _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + work)
    _mount(libc, work, root + work, None, MS_BIND | MS_REC)
    _mount(libc, None, root + work, None,
           MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | _locked_flags(root + work))
    _mount(libc, None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    nr = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is not None:  # pivot_root(".", ".") then detach the old root stacked under it
        _check(libc.syscall(nr, b".", b"."), "pivot_root")
        _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    else:  # safe enough: the child is unprivileged and has no CAP_SYS_CHROOT to break out
        os.chroot(".")
    os.chdir("/")


def _exec_target(libc, spec: dict, status_fd: int) -> None:
    import resource

    try:
        os.set_inheritable(status_fd, False)  # the exec closes it
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["uid"], spec["uid"], spec["uid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(spec["work"])
        os.umask(0o022)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as e:  # noqa: BLE001 - report anything, then die without cleanup
        os.write(status_fd, (json.dumps({"error": f"exec {spec['argv'][0]!r}: {e!r}"})
                             + "\n").encode())
        os._exit(127)


def _wait_for(pid: int) -> int:
    """Reap children (as a pid-namespace init we inherit orphans) until `pid` exits."""
    while True:
        got, status = os.waitpid(-1, 0)
        if got == pid:
            return status


def _bootstrap(spec: dict) -> None:
    import resource

    status_fd = spec["status_fd"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        libc = _libc()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if spec["cgroup_procs"]:
            try:
                with open(spec["cgroup_procs"], "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:  # not fatal: the uid's RLIMIT_NPROC still caps processes
                os.write(status_fd, (json.dumps({"warning": f"cgroup join: {e!r}"}) + "\n")
                         .encode())
        flags = spec["flags"]
        if flags:
            outer_uid, outer_gid = os.geteuid(), os.getegid()
            _check(libc.unshare(flags), "unshare")
            if flags & CLONE_NEWUSER:  # map ourselves to root inside, to be allowed to mount
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"0 {outer_uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"0 {outer_gid} 1")
        if flags & CLONE_NEWPID:  # the next child is the namespace's init
            pid = os.fork()
            if pid:
                _wait_for(pid)
                os._exit(0)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if flags & CLONE_NEWNS:
            _build_root(libc, spec)
    except BaseException as e:  # noqa: BLE001
        os.write(status_fd, (json.dumps({"error": f"sandbox setup: {e!r}"}) + "\n").encode())
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        _exec_target(libc, spec, status_fd)
    status = _wait_for(pid)
    msg = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
           else {"exit": os.WEXITSTATUS(status)})
    os.write(status_fd, (json.dumps(msg) + "\n").encode())
    os._exit(0)  # as a pid-namespace init, this kills whatever the target left behind


if __name__ == "__main__":
    _bootstrap(json.loads(sys.argv[1]))
    raise SystemExit(0)
