"""Runs inside fresh namespaces (started by `unshare` as root) before the sandboxed pytest.

    unshare --mount --net --pid ... python -I -S _sandbox_boot.py --workdir DIR --uid U --gid G \
        --tmpfs-mb N [--expose PATH ...] -- COMMAND...

Makes every mount private; opens the scenario folder and the --expose paths (the Python installation and
the sandbox's pytest plugins); puts private tmpfs over /tmp, /var/tmp and /dev/shm and over every folder
that user U could not pass through on the way to an exposed path (such as a 0700 /root holding the
interpreter: its other contents are hidden); binds the folder and the exposed paths back at their own
paths; remounts / read-only; changes into the folder; drops to U/G with no-new-privileges; and execs
COMMAND. Without --workdir it only checks that all this works (the namespace probe). Standard library only
(it runs with -S, before any site-packages).
"""
import ctypes
import os
import resource
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    encode = (lambda s: s.encode() if s is not None else None)
    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _passable(path, uid, gid):
    info = os.stat(path)
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _blocking_ancestor(path, uid, gid):
    """The first folder above `path` that uid/gid cannot pass through, or None."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        folder = "/" + "/".join(parts[:depth])
        if not _passable(folder, uid, gid):
            return folder
    return None


def isolate(workdir, exposes, uid, gid, tmpfs_mb):
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = sorted({os.path.realpath(p) for p in exposes if os.path.isdir(p)} | ({workdir} if workdir else set()),
                  key=len)
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep}
    masks = {a for a in (_blocking_ancestor(p, uid, gid) for p in keep) if a}
    masks = {m for m in masks if not any(m != other and m.startswith(other + "/") for other in masks)}
    for folder in SCRATCH:
        if os.path.isdir(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=1777")
    for folder in sorted(masks):
        os.makedirs(folder, exist_ok=True)  # a mask inside a scratch folder (a 0700 /tmp/tmp.X) is gone by now
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in keep:
        if path == workdir or not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{handles[path]}", path, None, MS_BIND)
        os.close(handles[path])
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def main(argv):
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    values, exposes = {}, []
    for key, value in zip(options[::2], options[1::2]):
        if key == "--expose":
            exposes.append(value)
        else:
            values[key] = value
    workdir = values.get("--workdir")
    uid, gid = int(values["--uid"]), int(values["--gid"])
    isolate(workdir, exposes, uid, gid, int(values.get("--tmpfs-mb", "64")))
    os.chdir(workdir or "/")
    resource.setrlimit(resource.RLIMIT_NPROC, (128, 128))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
