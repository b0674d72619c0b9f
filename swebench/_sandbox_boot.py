"""Runs inside fresh namespaces (started by `unshare` as root) before the sandboxed pytest.

    unshare --mount --net --pid ... python -I -S _sandbox_boot.py --workdir DIR --uid U --gid G \
        --tmpfs-mb N [--expose PATH ...] [--hide PATH ...] -- COMMAND...

Makes every mount private; puts an empty tmpfs over each --hide folder (the host's folders outside the
system ones: the repository, with its scenario files and generators, /root, /home, ...); opens the
scenario folder and the --expose paths (the Python installation and
the sandbox's pytest plugins); puts private tmpfs over /tmp, /var/tmp and /dev/shm and over every folder
that user U could not pass through on the way to an exposed path (such as a 0700 /root holding the
interpreter: its other contents are hidden); binds the folder and the exposed paths back at their own
paths; then makes every mount read-only (and nosuid) except the scenario folder and the scratch tmpfs: the
root file system, the bound Python installation, venv and plugin folders, /dev, /sys, /proc and any other
mount of the host; changes into the folder; drops to U/G with no-new-privileges; and execs COMMAND. Without --workdir it only checks that all this works (the namespace probe). Standard library only
(it runs with -S, before any site-packages).
"""
import ctypes
import os
import resource
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (1, 2, 4, 8, 32, 4096, 16384,
                                                                            1 << 18)
EINVAL, ENOENT = 22, 2
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


def _unescape(field):
    """A mountinfo path: spaces, tabs, newlines and backslashes come as octal escapes (\\040)."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def _mounts():
    """(mount point, per-mount options) of every mount of this namespace, in mount order."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        rows = [line.split() for line in handle if line.strip()]
    return [(_unescape(row[4]), set(row[5].split(","))) for row in rows if len(row) > 5]


def read_only_except(writable):
    """Remount every mount read-only and nosuid, except the mounts at the paths in `writable` (bind remounts
    keep each mount's nodev/noexec, which a container may have locked). A mount point that is hidden now
    (under a tmpfs mask or the fresh /proc) is skipped: the mount over it is remounted in its turn."""
    done = set()
    for point, options in _mounts():
        if point in writable or point in done:
            continue
        done.add(point)
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        flags |= (MS_NODEV if "nodev" in options else 0) | (MS_NOEXEC if "noexec" in options else 0)
        try:
            _mount(None, point, None, flags)
        except OSError as err:
            if err.errno in (EINVAL, ENOENT) and not _is_mount_point(point):
                continue  # hidden or gone: not reachable from inside
            raise


def _is_mount_point(path):
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def isolate(workdir, exposes, uid, gid, tmpfs_mb, hides=()):
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = sorted({os.path.realpath(p) for p in exposes if os.path.isdir(p)} | ({workdir} if workdir else set()),
                  key=len)
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep}
    masks = {a for a in (_blocking_ancestor(p, uid, gid) for p in keep) if a}
    masks = {m for m in masks if not any(m != other and m.startswith(other + "/") for other in masks)}
    for folder in hides:  # hidden from the sandbox; the kept paths under it are bound back below
        if os.path.isdir(folder) and not os.path.islink(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
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
    # the exposed paths were bound back read-write (a bind keeps its source's flags), and /dev, /sys, /proc
    # and other mounts of the host are still writable: only the scenario folder and the scratch tmpfs stay so
    writable = {folder for folder in SCRATCH if os.path.isdir(folder)}
    read_only_except(writable | ({workdir} if workdir else set()))


def main(argv):
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    values, exposes, hides = {}, [], []
    for key, value in zip(options[::2], options[1::2]):
        if key == "--expose":
            exposes.append(value)
        elif key == "--hide":
            hides.append(value)
        else:
            values[key] = value
    workdir = values.get("--workdir")
    uid, gid = int(values["--uid"]), int(values["--gid"])
    isolate(workdir, exposes, uid, gid, int(values.get("--tmpfs-mb", "64")), hides)
    os.chdir(workdir or "/")
    resource.setrlimit(resource.RLIMIT_NPROC, (128, 128))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.execv(command[0], command)


if __name__ == "__main__":
    if "--" not in sys.argv[1:]:  # run by hand (e.g. --help): this is not a command a person gives input to
        print("swebench/_sandbox_boot.py is internal: swebench/sandbox.py starts it inside fresh namespaces (see "
              "its docstring); run scenarios with python -m swebench.selftest", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
