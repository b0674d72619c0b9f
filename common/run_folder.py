"""What the training CLIs share about their output folders: the checks before any work, the file modes of what
they write, and how a Ctrl-C waits while a run's files are replaced.

- `check_output_dir` / `check_model`: raise InputError (exit 2, one line) before a model loads (the folder and
  model checks of common.io, plus "not one of the run's inputs" and "a hub id goes to the loader").
- `follow_umask`: safetensors (and tempfile's staging folders) create owner-only entries (0600 / 0700); an
  artifact gets the mode any other file of the user gets, so e.g. a vLLM server running as another user can
  read an adapter.
- `sigint_deferred` holds a Ctrl-C while a run's files are replaced, so each is the old one or the complete new
  one (common/cli.py's `exit_code` turns the Ctrl-C into one line and exit 130).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Iterable, Iterator

from common.io import check_model_folder, check_output_folder, current_umask
from common.validation import InputError


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file or folder (after symlinks and `..`; either may not exist yet)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_output_dir(path: str | os.PathLike, flag: str, *, inputs: Iterable[tuple[str, str | os.PathLike]] = ()
                     ) -> Path:
    """`path` as a Path if a run can write its folder there (common.io.check_output_folder: not a file, not
    under one, creatable), and it is none of `inputs` ((flag, path) pairs: the output must not replace what the
    run reads); else InputError naming `flag` and the fix."""
    text = os.fspath(path)
    for name, other in inputs:
        if text and other and same_path(text, other):
            raise InputError(f"{flag} {text} is also {name}: the run would overwrite what it reads; "
                             f"give {flag} a new folder")
    check_output_folder(path, flag)
    return Path(text)


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
