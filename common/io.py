"""Small file helpers shared by every pipeline command.

Writes go to a temporary file in the destination folder and are renamed into place, so a killed
process never leaves a half-written artifact (see docs/ARTIFACTS.md, "Writing files"). A new file gets
the mode any other program would give it (0666 minus the umask); a file that is replaced keeps its mode.
Reads raise `InputError`, which every CLI turns into exit code 2 with the file named.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

from common.validation import InputError


def _writable_ancestor(target: Path, text: str, flag: str) -> Path:
    """The nearest existing ancestor folder of `target`, checked to be a folder where files can be created."""
    folder = target.parent
    try:
        while not folder.exists() and folder != folder.parent:  # walk up to the folder that exists
            folder = folder.parent
    except OSError as err:  # e.g. a parent we may not even look into
        raise InputError(f"{flag} {text}: cannot check its folder ({err.strerror or err}); "
                         "pick a folder you can write to") from None
    if not folder.is_dir():
        raise InputError(f"{flag} {text}: {folder} is a file, not a folder; pick another path for {flag}")
    _probe_writable(folder, text, flag)
    return folder


def _probe_writable(folder: Path, text: str, flag: str) -> None:
    """InputError unless a file can be created in `folder` (an anonymous temporary file: nothing is left)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise InputError(f"{flag} {text}: cannot create files in {folder} ({err.strerror or err}); "
                         f"pick a writable folder for {flag}") from None


Inputs = Iterable[tuple[str, "str | os.PathLike | None"]]  # (what it is: a flag or a name, its path); None: unset


def _resolved(path: str | os.PathLike) -> Path:
    """`path` with symlinks and `..` resolved (`~` is a folder name here, as it is to open()); as written, made
    absolute, when it cannot be resolved (a symlink loop, a folder we may not look into)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file or folder (after symlinks and `..`; either may not exist yet)."""
    return _resolved(a) == _resolved(b)


def check_not_an_input(output: str | os.PathLike, flag: str, inputs: Inputs, *, folder: bool = False) -> None:
    """The one rule of output over input: InputError when `output` is one of the command's `inputs` (the same
    file or folder, links and `..` resolved) or, for a `folder` output, holds one of them (a run folder is
    written file by file and may be emptied by --overwrite: what it holds is not safe). Call it, through
    check_output_path / check_output_folder, before any work starts."""
    target = _resolved(output)
    for what, source in inputs:
        if source is None or not os.fspath(source):
            continue
        read = _resolved(source)
        if read == target:
            raise InputError(f"{flag} {output} is also {what}: the command would overwrite what it reads; write "
                             f"{flag} elsewhere")
        if folder and target in read.parents:
            raise InputError(f"{flag} {output} holds {what} ({source}): the command would write over what it reads; "
                             f"give {flag} a folder outside it")


def check_output_path(path: str | os.PathLike, flag: str, inputs: Inputs = ()) -> None:
    """Raise InputError unless `path` can be written as an output file; call it before any work starts.

    Refused: an empty path, a path ending in a separator or naming an existing folder, a path whose nearest
    existing ancestor is a file or a folder where no file can be created, and one of the command's `inputs`
    ((what, path) pairs, see check_not_an_input). Missing parent folders are fine (the atomic writers create
    them). Writability is probed by opening an anonymous temporary file in that ancestor (nothing is left
    behind), so it also holds for root and read-only file systems.
    """
    text = os.fspath(path)
    if not text:
        raise InputError(f"{flag} is empty; give a file path, e.g. {flag} runs/out.json")
    target = Path(text)
    if text.endswith(("/", os.sep)) or target.is_dir():
        raise InputError(f"{flag} {text}: is a folder, not a file; give a file path inside it, "
                         f"e.g. {flag} {target / 'out.json'}")
    check_not_an_input(text, flag, inputs)
    _writable_ancestor(target, text, flag)


def check_output_folder(path: str | os.PathLike, flag: str, inputs: Inputs = ()) -> None:
    """Raise InputError unless `path` is a folder files can be created in, or one that can be created
    (its nearest existing ancestor is a writable folder), that neither is nor holds one of the command's
    `inputs` (check_not_an_input); call it before any work starts. Creates nothing."""
    text = os.fspath(path)
    if not text:
        raise InputError(f"{flag} is empty; give a folder path, e.g. {flag} runs/out")
    target = Path(text)
    try:
        is_dir, exists = target.is_dir(), target.exists()
    except OSError as err:
        raise InputError(f"{flag} {text}: cannot check it ({err.strerror or err}); pick a folder you can write "
                         "to") from None
    if exists and not is_dir:
        raise InputError(f"{flag} {text}: is a file, not a folder; give a folder path for {flag}")
    check_not_an_input(text, flag, inputs, folder=True)
    if is_dir:
        _probe_writable(target, text, flag)
    else:
        _writable_ancestor(target, text, flag)



WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def check_model_folder(path: str | os.PathLike, flag: str) -> Path:
    """`path` as a Path if it is a local Hugging Face model folder (config.json and weights), else InputError
    naming what is missing; call it before loading (a missing file otherwise surfaces deep in transformers)."""
    folder = Path(path)
    if not folder.is_dir():
        what = "is a file, not a model folder" if folder.exists() else "model folder not found"
        raise InputError(f"{flag} {path}: {what}; give a local model folder (build one with "
                         "python -m train.tiny, or python -m train.models fetch)")
    if not (folder / "config.json").is_file():
        raise InputError(f"{flag} {path}: not a model folder (no config.json); give the folder a model was saved to")
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("model-*.safetensors")):
        raise InputError(f"{flag} {path}: no weights (none of {', '.join(WEIGHT_FILES)}); the model was not saved "
                         "completely, save or fetch it again")
    return folder


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask. Read from /proc where it exists: os.umask can only read it by setting it, which
    would briefly change it for every thread."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _new_file_mode(path: Path) -> int:
    """The mode a plain open() would give `path` (0666 minus the umask), or the mode of the file it replaces."""
    try:
        existing = path.stat()
    except OSError:
        return 0o666 & ~current_umask()
    return stat.S_IMODE(existing.st_mode) if stat.S_ISREG(existing.st_mode) else 0o666 & ~current_umask()


class NoSpaceError(OSError):
    """A write that ran out of disk space or quota: the message names the file, the bytes it needed and the bytes
    free there; the file's previous version is untouched (the write went to a temporary file). CLIs print it as
    one line and exit 1 (common/cli.py)."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def no_space_error(code: int, target: Path, needed: int | None, kept: str) -> NoSpaceError:
    """The NoSpaceError of a write to `target` (a file, or a folder written through a staging folder) that
    needed `needed` bytes (None: not known) and found no room; `kept` says what is left as it was."""
    folder = target if target.is_dir() else target.parent
    free = _free_bytes(folder)
    return NoSpaceError(code, f"{target}: no space left to write "
                        + (f"{needed:,} bytes" if needed is not None else "it")
                        + (f" ({free:,} bytes free in {folder})" if free is not None else "")
                        + f"; {kept}: free some space (or write elsewhere) and run again")


@contextlib.contextmanager
def naming_no_space(target: Path, needed: int | None, kept: str) -> Iterator[None]:
    """Inside: a write for `target` that runs out of space (ENOSPC, EDQUOT) raises `no_space_error`. Before
    anything is written, refuses at once when the folder has fewer than `needed` bytes free, so a large file
    (a model's weights: safetensors reports a full disk as its own error, without errno) is not started."""
    folder = target if target.is_dir() else target.parent
    free = _free_bytes(folder) if needed is not None else None
    if free is not None and free < needed:
        raise no_space_error(errno.ENOSPC, target, needed, kept)
    try:
        yield
    except OSError as err:
        if err.errno not in NO_SPACE:
            raise
        raise no_space_error(err.errno, target, needed, kept) from None


@contextlib.contextmanager
def staging_folder(directory: Path, prefix: str, needed: int | None, kept: str) -> Iterator[Path]:
    """A temporary folder inside `directory` for files written together and then moved in (a model, an adapter, a
    checkpoint), removed on the way out whatever happens; a full disk there raises `naming_no_space`'s error."""
    with naming_no_space(directory, needed, kept):
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """The bytes the weights of `tensors` (torch tensors or parameters) take in a safetensors file."""
    return sum(t.numel() * t.element_size() for t in tensors)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line (`line` ends with a newline) to `path` durably (fsync). A write that fails midway (a full
    disk) is cut back, so the file still ends with its last whole line; then NoSpaceError names the file and the
    bytes the line needed. Appending, not rewriting, keeps each iteration's cost independent of the file's size;
    readers of the project's line files also skip a line a kill cut short."""
    path = Path(path)
    data = line.encode("utf-8", "backslashreplace")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _new_file_mode(path))
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as err:
            with contextlib.suppress(OSError):  # a device (e.g. /dev/full) cannot be cut back
                os.ftruncate(fd, start)
            if err.errno in NO_SPACE:
                raise no_space_error(err.errno, path, len(data),
                                     "the file ends with its last whole line") from None
            raise
    finally:
        os.close(fd)


def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename).

    mkstemp creates its file with mode 0600 whatever the umask is; the file is given the usual mode before
    anything is written, so the artifact is as readable as any other file the user creates. A full disk (or
    quota) raises NoSpaceError naming the file and the space it needed; `path` keeps its previous content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            kept = "its previous version is unchanged" if path.exists() else "nothing was written"
            raise no_space_error(err.errno, path, len(data), kept) from None
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically as UTF-8.

    Text that UTF-8 cannot encode (a lone surrogate such as U+D800, which a broken `\\u` escape in an input
    file becomes) raises InputError naming the character and its position; nothing is written.
    """
    path = Path(path)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f"{path}: cannot write: character {err.object[err.start]!r} at position {err.start} has no "
                         "UTF-8 form (a lone surrogate, from a broken \\u escape in an input file); fix that input "
                         "and run again") from None
    return _atomic_write_bytes(path, data)


def _encode_json(text: str) -> bytes:
    """UTF-8 bytes of json.dumps(..., ensure_ascii=False) output.

    A lone surrogate can only sit inside a JSON string there; it is written as its `\\uXXXX` escape, which is
    valid JSON, reads back to the same string, and keeps the file valid UTF-8.
    """
    return text.encode("utf-8", "backslashreplace")


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Serialise `obj` as JSON and write it atomically."""
    return _atomic_write_bytes(Path(path), _encode_json(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"))


# Characters str.splitlines() breaks at besides \n and \r that json.dumps(..., ensure_ascii=False) writes raw.
_RAW_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def json_line(obj: Any) -> str:
    """`obj` as one JSONL line (newline included): non-ASCII text kept readable, but U+2028, U+2029 and U+0085
    (which can only occur inside a JSON string) written as their `\\uXXXX` escapes, so a reader that splits at
    every Unicode line break (str.splitlines) still sees one record per line."""
    text = json.dumps(obj, ensure_ascii=False)
    for raw, escaped in _RAW_LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text + "\n"


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL text, split at newlines only. str.splitlines() also splits at U+2028, U+2029 and U+0085,
    which JSON allows raw inside a string (files written before `json_line` escaped them, or by other tools, hold
    them), so it would cut a valid record in two."""
    return text.split("\n")


def atomic_write_jsonl(path: str | os.PathLike, records: list[Any]) -> Path:
    """Write one JSON object per line (see `json_line`), atomically."""
    text = "".join(json_line(r) for r in records)
    return _atomic_write_bytes(Path(path), _encode_json(text))


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A UTF-8 file's text; a missing or unreadable file raises InputError naming it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read ({err})") from None


def load_yaml_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML config file's top-level mapping; a missing file, broken YAML, a non-mapping or an empty file (only
    blanks or comments: most likely the wrong file or one not written yet) raises InputError."""
    import yaml

    text = read_text(path, "config file")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InputError(f"{path}: invalid YAML{where}: {problem}") from None
    if loaded is None:
        raise InputError(f"{path}: the config file is empty (no key: value); write the fields to set in it, or leave "
                         "the flag out for the defaults")
    if not isinstance(loaded, dict):
        raise InputError(f"{path}: the config must be a YAML mapping (key: value), got {type(loaded).__name__}")
    return loaded


def load_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing file or broken JSON raises InputError naming the file."""
    path = Path(path)
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: broken JSON at line {err.lineno} column {err.colno}: {err.msg}") from None


def load_jsonl(path: str | os.PathLike) -> list[Any]:
    """Read a JSONL file (blank lines skipped); broken lines raise InputError with the line number."""
    path = Path(path)
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read ({err})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: broken JSON on line {number}: {err.msg}") from None
    return records


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a folder's entries (names created, renamed or removed there), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every folder (deepest first, `root` last)."""
    folders = [root]
    for entry in sorted(root.rglob("*")):
        if entry.is_symlink():
            continue
        if entry.is_dir():
            folders.append(entry)
            continue
        fsync_path(entry)
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        fsync_path(folder)


def publish_staged(staging: Path, directory: Path, names: Iterable[str] | None = None) -> None:
    """Move the files staged in `staging` into `directory` (in the order of `names`, default all of them),
    durably: they are fsynced before the first rename and `directory` after the last, so a power loss leaves the
    old files or the new ones, never a renamed name whose bytes had not reached the disk."""
    fsync_tree(staging)
    for name in list(os.listdir(staging) if names is None else names):
        os.replace(staging / name, directory / name)
    fsync_path(directory)
