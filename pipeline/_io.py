"""Small file helpers shared by every pipeline command.

Writes go to a temporary file in the destination folder and are renamed into place, so a killed
process never leaves a half-written artifact (see design/ARTIFACTS.md, "Writing files").
Reads raise `InputError`, which every CLI turns into exit code 2 with the file named.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class InputError(Exception):
    """Bad user input (a file, a flag). CLIs print it and exit 2; nothing is written."""


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Serialise `obj` as JSON and write it atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, records: list[Any]) -> Path:
    """Write one JSON object per line, atomically."""
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


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
    """A YAML config file's top-level mapping ({} for an empty file); a missing file, broken YAML or a
    non-mapping raises InputError."""
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
        return {}
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
        lines = path.read_text(encoding="utf-8").splitlines()
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
