"""How every command ends when it cannot go on, written once:

- bad input: `@cli_entry` on the entry function turns an InputError (common/validation.py: a flag, a file, a
  config value that cannot be used) into one line, `error: <what is wrong and the fix>`, on stderr and exit
  status 2, before any work starts; no traceback. It applies in process too (`main([...])` returns 2).
- a full disk: a NoSpaceError (common/io.py's atomic writers) becomes one line naming the file and the space it
  needed, exit status 1.
- Ctrl-C: `exit_code(main)`, the `if __name__ == "__main__":` of every command, turns it into one line,
  `interrupted; <what to do next>`, and exit status 130. Only there: a program that calls `main` in process
  gets the KeyboardInterrupt and stops too. A command that knows what to do next (resume with ...) raises
  `Interrupted("resume with: ...")` from the KeyboardInterrupt it catches.

    @cli_entry
    def main(argv: list[str] | None = None) -> int:
        ...                                    # raise InputError(...) where the input is checked

    if __name__ == "__main__":
        sys.exit(exit_code(main))
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any, Callable

from common.io import NoSpaceError
from common.validation import InputError

FAILED = 1  # exit status of a command that could not finish (e.g. a full disk)
INPUT_ERROR = 2  # exit status of a command refused at the door
INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def cli_entry(entry: Callable[..., int]) -> Callable[..., int]:
    """`entry(...)`, or after an InputError the line `error: ...` on stderr and INPUT_ERROR."""

    @functools.wraps(entry)
    def checked(*args: Any, **kwargs: Any) -> int:
        try:
            return entry(*args, **kwargs)
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return INPUT_ERROR
        except NoSpaceError as err:  # the disk filled up: not bad input, but one line says which file and how much
            print(f"error: {err.strerror}", file=sys.stderr)
            return FAILED

    return checked


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what to do next (e.g. the command that resumes the run). A CLI's `main` raises it from the
    KeyboardInterrupt it catches; a KeyboardInterrupt still, so a program that called `main` in process stops too."""


def exit_code(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """`main(argv)`, or after a Ctrl-C one line on stderr, `interrupted; <what to do next>`, and 130 (no traceback).
    The `if __name__ == "__main__":` of every command: `sys.exit(exit_code(main))`."""
    try:
        return main(argv)
    except KeyboardInterrupt as err:
        next_step = str(err) if isinstance(err, Interrupted) and str(err) else "nothing was saved by this run"
        if os.environ.get("RANK", "0") == "0":  # under torchrun, one line for the job
            print(f"interrupted; {next_step}", file=sys.stderr, flush=True)
        # CPython marks a Ctrl-C that ended an exec() or eval() of a *string* as unhandled, whoever catches it
        # later, and a `python -m` run then kills itself with SIGINT at exit instead of returning this status.
        # Running a string clears the mark (run_eval_code_obj resets it before it runs).
        exec("pass")  # noqa: S102 -- a constant
        return INTERRUPTED


def seed_value(text: str) -> int:
    """argparse `type=` of a seed flag: an integer >= 0 (numpy and the task generators refuse negative seeds,
    and -1 read as "random" would make a run impossible to repeat)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {value}")
    return value
