"""Unified diffs over in-memory file trees ({path: text}), without `git` or `patch`.

    patch = make_patch(before, after)       # "--- a/pkg/x.py\\n+++ b/pkg/x.py\\n@@ ... @@\\n..."
    after = apply_patch(before, patch)      # strict: every hunk's context must match exactly
    edits = replacements(before_text, after_text)   # [(old, new), ...] each `old` unique when applied in order

Only modifications of existing files are supported (scenario oracles never create or delete files);
a patch that adds or removes a file, or whose context does not match, raises `PatchError` saying which
file and hunk.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """A patch that cannot be read or does not apply; the message names the file and the hunk."""


def make_patch(before: dict[str, str], after: dict[str, str], context: int = 3) -> str:
    """A unified diff (a/ and b/ prefixes) taking `before` to `after`; both must hold the same paths."""
    if set(before) != set(after):
        added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        raise PatchError(f"make_patch compares the same files only; added {added}, removed {removed}")
    pieces = []
    for path in sorted(before):
        if before[path] == after[path]:
            continue
        old, new = _lines(before[path]), _lines(after[path])
        diff = difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=context)
        for line in diff:
            pieces.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(pieces)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


@dataclass
class _Hunk:
    old_start: int
    old_lines: list[str]  # context and removed lines, without the leading marker
    new_lines: list[str]  # context and added lines


@dataclass
class FilePatch:
    path: str
    hunks: list[_Hunk]


def parse_patch(patch: str) -> list[FilePatch]:
    """The file patches of a unified diff; PatchError on anything malformed."""
    if not isinstance(patch, str) or not patch.strip():
        raise PatchError("the patch is empty")
    lines = patch.splitlines(keepends=True)
    files: list[FilePatch] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("--- "):
            if index + 1 >= len(lines) or not lines[index + 1].startswith("+++ "):
                raise PatchError(f"line {index + 1}: '---' header without a '+++' line after it")
            old_name = line[4:].strip().split("\t")[0]
            new_name = lines[index + 1][4:].strip().split("\t")[0]
            if old_name == "/dev/null" or new_name == "/dev/null":
                raise PatchError(f"line {index + 1}: patches that create or delete files are not supported")
            if not old_name.startswith("a/") or not new_name.startswith("b/") or old_name[2:] != new_name[2:]:
                raise PatchError(f"line {index + 1}: expected '--- a/PATH' and '+++ b/PATH' with the same PATH, "
                                 f"got {old_name!r} and {new_name!r}")
            current = FilePatch(old_name[2:], [])
            files.append(current)
            index += 2
            continue
        match = _HUNK_HEADER.match(line)
        if match:
            if not files:
                raise PatchError(f"line {index + 1}: hunk before any '--- a/PATH' header")
            old_start, old_count = int(match.group(1)), int(match.group(2) or 1)
            new_count = int(match.group(4) or 1)
            old_lines: list[str] = []
            new_lines: list[str] = []
            index += 1
            while index < len(lines) and (len(old_lines) < old_count or len(new_lines) < new_count):
                body = lines[index]
                marker, text = body[:1], body[1:]
                if body.startswith("\\"):  # "\ No newline at end of file": strip the newline just added
                    _strip_last_newline(old_lines, new_lines, previous=lines[index - 1][:1])
                elif marker == " ":
                    old_lines.append(text)
                    new_lines.append(text)
                elif marker == "-":
                    old_lines.append(text)
                elif marker == "+":
                    new_lines.append(text)
                elif body in ("\n", "\r\n"):  # an empty context line whose leading space was stripped
                    old_lines.append(body)
                    new_lines.append(body)
                else:
                    raise PatchError(f"{files[-1].path}: line {index + 1}: unexpected hunk line {body[:40]!r}")
                index += 1
            if len(old_lines) != old_count or len(new_lines) != new_count:
                raise PatchError(f"{files[-1].path}: hunk at line {old_start} is truncated "
                                 f"(header says -{old_count} +{new_count}, found -{len(old_lines)} +{len(new_lines)})")
            if index < len(lines) and lines[index].startswith("\\"):
                _strip_last_newline(old_lines, new_lines, previous=lines[index - 1][:1])
                index += 1
            files[-1].hunks.append(_Hunk(old_start, old_lines, new_lines))
            continue
        index += 1  # "diff --git", "index ..." and other noise between files
    if not files:
        raise PatchError("no '--- a/PATH' / '+++ b/PATH' file header found")
    for file in files:
        if not file.hunks:
            raise PatchError(f"{file.path}: file header without hunks")
    return files


def _strip_last_newline(old_lines: list[str], new_lines: list[str], previous: str) -> None:
    targets = {" ": (old_lines, new_lines), "-": (old_lines,), "+": (new_lines,)}.get(previous, ())
    for lines in targets:
        if lines and lines[-1].endswith("\n"):
            lines[-1] = lines[-1][:-1]


def apply_patch(files: dict[str, str], patch: str) -> dict[str, str]:
    """A copy of `files` with `patch` applied. Hunks must match at their stated line (no fuzz, no offset)."""
    out = dict(files)
    for file in parse_patch(patch):
        if file.path not in out:
            raise PatchError(f"{file.path}: the patch changes a file that does not exist")
        lines = _lines(out[file.path])
        result: list[str] = []
        position = 0  # next unread line of the original
        for number, hunk in enumerate(file.hunks, start=1):
            start = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
            if start < position:
                raise PatchError(f"{file.path}: hunk {number} overlaps the previous one")
            if lines[start:start + len(hunk.old_lines)] != hunk.old_lines:
                raise PatchError(f"{file.path}: hunk {number} (line {hunk.old_start}) does not match the file")
            result.extend(lines[position:start])
            result.extend(hunk.new_lines)
            position = start + len(hunk.old_lines)
        result.extend(lines[position:])
        out[file.path] = "".join(result)
    return out


def replacements(before: str, after: str) -> list[tuple[str, str]]:
    """(old, new) text replacements turning `before` into `after`, applied one after the other.

    Each changed block of lines becomes one replacement whose `old` is grown with surrounding lines until
    it occurs exactly once in the text it is applied to (so a str-replace tool accepts it).
    """
    if before == after:
        return []
    edits: list[tuple[str, str]] = []
    current = _lines(before)
    target = _lines(after)
    while current != target:
        matcher = difflib.SequenceMatcher(a=current, b=target, autojunk=False)
        _, i1, i2, j1, j2 = next(op for op in matcher.get_opcodes() if op[0] != "equal")
        text = "".join(current)
        low, high = i1, i2
        while True:
            old = "".join(current[low:high])
            if (old and text.count(old) == 1) or (low == 0 and high == len(current)):
                break
            low, high = max(0, low - 1), min(len(current), high + 1)  # one more line of context each side
        new = "".join(current[low:i1] + target[j1:j2] + current[i2:high])
        edits.append(("".join(current[low:high]), new))
        current = current[:i1] + target[j1:j2] + current[i2:]
    return edits
