"""Import a generated package straight from a {path: text} dict, in this process.

Only for code this project generated itself (the generators use it to compute the expected values their
tests assert, and to check that the bug changes exactly the results it should). Untrusted code (model
patches, scenario files read from disk) always runs in the sandbox (`swebench.sandbox`).

    with InMemoryPackages(files) as imp:
        api = imp.module("greenhouse.api")
        value = imp.evaluate("top_zone([Reading('a', 1, 2)])", "from greenhouse.api import top_zone, Reading")
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from typing import Any

_LOCK = threading.RLock()  # sys.modules and sys.meta_path are process-wide


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, files: dict[str, str], roots: set[str]) -> None:
        self.sources: dict[str, tuple[str, bool]] = {}  # module name -> (source, is_package)
        for path, text in files.items():
            if not path.endswith(".py"):
                continue
            parts = path[:-3].split("/")
            if parts[0] not in roots:
                continue
            if parts[-1] == "__init__":
                self.sources[".".join(parts[:-1])] = (text, True)
            else:
                self.sources[".".join(parts)] = (text, False)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.sources:
            return None
        _, is_package = self.sources[fullname]
        return importlib.util.spec_from_loader(fullname, self, is_package=is_package)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        source, is_package = self.sources[module.__name__]
        module.__file__ = f"<generated {module.__name__}>"
        if is_package:
            module.__path__ = []
        exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 -- our own generated code


class InMemoryPackages:
    """Context manager: the top-level packages of `files` become importable; they are purged on exit."""

    def __init__(self, files: dict[str, str]) -> None:
        self.roots = {path.split("/")[0] for path in files if "/" in path and path.endswith("__init__.py")
                      and path.count("/") == 1}
        self.finder = _Finder(files, self.roots)

    def __enter__(self) -> "InMemoryPackages":
        _LOCK.acquire()
        self._purge()
        sys.meta_path.insert(0, self.finder)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            sys.meta_path.remove(self.finder)
            self._purge()
        finally:
            _LOCK.release()

    def _purge(self) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in self.roots:
                del sys.modules[name]
        importlib.invalidate_caches()

    def module(self, name: str) -> Any:
        return importlib.import_module(name)

    def evaluate(self, expression: str, imports: str) -> tuple[bool, Any]:
        """(True, value) of `expression` after running `imports`, or (False, exception type name)."""
        namespace: dict[str, Any] = {}
        # Compiled first: CPython's exec/eval of a *string* that a Ctrl-C interrupts marks the interrupt unhandled
        # for good, and a `python -m` run then ends by SIGINT even after it handled it (common/cli.exit_code).
        exec(compile(imports, "<imports>", "exec"), namespace)  # noqa: S102 -- our own generated code
        try:
            return True, eval(compile(expression, "<expression>", "eval"), namespace)  # noqa: S307 -- ours
        except Exception as err:  # noqa: BLE001 -- the generated bug may raise anything; the caller compares
            return False, type(err).__name__
