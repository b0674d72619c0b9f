"""The one way a command fails on bad input: `@cli_entry` on its entry function turns an InputError (a flag, a
file, a config that cannot be used) into one line, `error: <what is wrong and the fix>`, on stderr and exit
status 2, before any work starts; no traceback. Ctrl-C is common.run_folder.exit_code's (exit 130):

    @cli_entry
    def main(argv: list[str] | None = None) -> int:
        ...                                    # raise InputError(...) where the input is checked

    if __name__ == "__main__":
        sys.exit(exit_code(main))
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from common.validation import InputError

INPUT_ERROR = 2  # exit status of a command refused at the door


def cli_entry(entry: Callable[..., int]) -> Callable[..., int]:
    """`entry(...)`, or after an InputError the line `error: ...` on stderr and INPUT_ERROR."""

    @functools.wraps(entry)
    def checked(*args: Any, **kwargs: Any) -> int:
        try:
            return entry(*args, **kwargs)
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return INPUT_ERROR

    return checked
