"""What the training CLIs share about their output folders: the checks before any work, the file modes of what
they write, and how a Ctrl-C waits while a run's files are replaced.

- `check_output_dir` / `check_model`: raise InputError (exit 2, one line) before a model loads (the folder and
  model checks of common.io, plus "not one of the run's inputs" and "a hub id goes to the loader").
- `follow_umask`: safetensors (and tempfile's staging folders) create owner-only entries (0600 / 0700); an
  artifact gets the mode any other file of the user gets, so e.g. a vLLM server running as another user can
  read an adapter.
- `claimed_run_folder`: one folder, one run: a second process on the folder is refused at once, a new run is
  refused a folder that holds another run's files (unless it resumes it or is told to overwrite it).
- `sigint_deferred` holds a Ctrl-C while a run's files are replaced, so each is the old one or the complete new
  one (common/cli.py's `exit_code` turns the Ctrl-C into one line and exit 130).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from common.io import check_model_folder, check_output_folder, current_umask
from common.validation import InputError


def check_output_dir(path: str | os.PathLike, flag: str, *, inputs: Iterable[tuple[str, str | os.PathLike]] = ()
                     ) -> Path:
    """`path` as a Path if a run can write its folder there (common.io.check_output_folder: not a file, not
    under one, creatable, neither one of `inputs` ((what, path) pairs) nor holding one); else InputError naming
    `flag` and the fix."""
    check_output_folder(path, flag, inputs)
    return Path(os.fspath(path))


def looks_local(model: str) -> bool:
    """Whether a model name is meant as a local folder rather than a hub id (`org/name`)."""
    return (Path(model).exists() or model.startswith((".", "/", "~")) or model.count("/") > 1
            or os.sep != "/" and os.sep in model)


def check_model(model: str, flag: str = "--model") -> None:
    """A model named as a local folder must be one (common.io.check_model_folder); a hub id (`org/name`) is
    left to the loader."""
    if looks_local(model):
        check_model_folder(model, flag)


def follow_umask(path: str | os.PathLike) -> None:
    """Give `path` (and, for a folder, everything in it) the mode a plain open()/mkdir() would: 0666 / 0777
    minus the umask. Call it on what a writer staged before it is renamed into place."""
    mask = current_umask()
    root = Path(path)
    for entry in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if not entry.is_symlink():
            os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~mask)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block until it ends, then raise KeyboardInterrupt: files replaced
    together are all old or all new. (Only the main thread receives signals; elsewhere this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


LOCK_NAME = ".run.lock"  # in a run folder while a command writes it: {"pid", "command", "host", "started"}
SET_ASIDE_NAME = ".previous-run"  # the run an --overwrite run replaces, until that run has ended


def _holder(text: str) -> dict:
    try:
        holder = json.loads(text)
    except ValueError:  # an empty or half-written lock file: nothing to name
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("command"):
        parts.append(f"`{holder['command']}`")
    if holder.get("started"):
        parts.append(f"since {holder['started']}")
    return ", ".join(parts)


def _alive(pid: object) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _locked(lock_path: Path, flag: str, folder: Path) -> Any:
    """The lock file, open and flock-ed by this process; InputError naming the holder when another has it."""
    while True:
        handle = open(lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _holder(handle.read())
            handle.close()
            raise InputError(f"{flag} {folder} is in use by another run ({_describe(holder)}); wait for it to end, "
                             f"or give {flag} another folder") from None
        try:
            same_file = os.fstat(handle.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            return handle
        handle.close()  # the holder removed the file as we opened it: lock the one now at the path


def _remove(entry: Path) -> None:
    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def run_entries(folder: Path) -> list[str]:
    """The names in a run folder that belong to a run (not the lock, not a set-aside previous run)."""
    return sorted(e.name for e in folder.iterdir() if e.name not in (LOCK_NAME, SET_ASIDE_NAME))


def _restore_set_aside(folder: Path) -> int:
    """Put back the previous run that an --overwrite run set aside, removing what that run wrote; the count."""
    aside = folder / SET_ASIDE_NAME
    for name in run_entries(folder):
        _remove(folder / name)
    names = sorted(e.name for e in aside.iterdir())
    for name in names:
        os.replace(aside / name, folder / name)
    aside.rmdir()
    return len(names)


@contextlib.contextmanager
def claimed_run_folder(path: str | os.PathLike, flag: str, *, fresh: bool, overwrite: bool = False,
                       restore_on_failure: bool = False, command: str | None = None, continue_hint: str = "",
                       ) -> Iterator[Path]:
    """One folder, one run: hold `path` for the block and refuse what would mix two runs' files.

    - **A second process** on the same folder is refused at once (InputError naming the holder's pid, command and
      start time). The lock is `fcntl.flock` on `LOCK_NAME` in the folder, so the kernel drops it when the
      holder dies however it dies; the file itself only names the holder. A lock file left by a dead process is
      taken over with a line on stderr saying whose it was.
    - **Another run's files**: with `fresh` (a new run, not a resume) a folder that holds anything but the lock
      is refused (`continue_hint` says how to continue that run), unless `overwrite`: then the old run's
      entries are removed before the new run writes any, so their metrics, checkpoints and results are never
      interleaved. With `restore_on_failure` (a command that cannot resume, e.g. SFT) the old run is only set
      aside (`SET_ASIDE_NAME`, one rename per entry) while the new one runs: deleted when the block ends
      normally, put back (the new run's files removed) when it raises (Ctrl-C, an error), so an interrupted
      --overwrite loses nothing; a run killed outright leaves it set aside and the next claim puts it back,
      saying so. A resumable command (GRPO) keeps its interrupted new run instead: its resume hint names it.

    Under torchrun only rank 0 claims (the other ranks write nothing of their own there). Raise InputError
    before any costly work: call it after the input checks, before the model loads.
    """
    if overwrite and not fresh:  # a resume (--resume) with --overwrite
        raise InputError("--overwrite starts a new run in place of the old one; --resume continues the old one: "
                         "pass one of them")
    folder = Path(path)
    if os.environ.get("RANK", "0") != "0":
        yield folder
        return
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / LOCK_NAME
    handle = _locked(lock_path, flag, folder)
    try:
        handle.seek(0)
        previous = _holder(handle.read())
        if previous.get("pid") and previous.get("pid") != os.getpid():
            state = "no longer running" if not _alive(previous.get("pid")) else "not holding it"
            print(f"{flag} {folder}: taking over the lock left by {_describe(previous)} ({state})", file=sys.stderr)
        if (folder / SET_ASIDE_NAME).is_dir():  # an --overwrite run that was killed before it ended
            count = _restore_set_aside(folder)
            print(f"{flag} {folder}: put back the previous run's {count} entries, which a killed --overwrite run "
                  "had set aside", file=sys.stderr)
        entries = run_entries(folder)
        set_aside = bool(fresh and entries)
        if set_aside:
            if not overwrite:
                shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
                raise InputError(f"{flag} {folder} holds another run's files ({shown}); "
                                 + (f"{continue_hint}, " if continue_hint else "")
                                 + f"pass --overwrite to replace it, or give {flag} a new folder")
            if restore_on_failure:
                aside = folder / SET_ASIDE_NAME
                aside.mkdir()
                for name in entries:
                    os.replace(folder / name, aside / name)
            else:
                for name in entries:
                    _remove(folder / name)
                print(f"{flag} {folder}: --overwrite removed the previous run ({len(entries)} entries)",
                      file=sys.stderr)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "command": command or shlex.join([os.path.basename(sys.argv[0]),
                                                                                     *sys.argv[1:]]),
                                 "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        try:
            yield folder
        except BaseException:
            if set_aside and restore_on_failure:
                with sigint_deferred():
                    _restore_set_aside(folder)
            raise
        else:
            if set_aside and restore_on_failure:
                shutil.rmtree(folder / SET_ASIDE_NAME)
                print(f"{flag} {folder}: --overwrite replaced the previous run ({len(entries)} entries)",
                      file=sys.stderr)
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()  # still under the flock: no other process holds this file
        handle.close()
        if created:  # a run refused (or failed) before it wrote anything leaves no folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


def add_overwrite_flag(parser: argparse.ArgumentParser) -> None:
    """`--overwrite` of a command that claims its output folder (`claimed_run_folder(..., overwrite=...)`)."""
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in an output folder that holds another run's files, replacing them "
                             "(without it such a folder is refused)")
