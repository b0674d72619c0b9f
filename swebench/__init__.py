"""TRACE's SWE-bench path: the pytest-graded scenario format, its generators, sandbox, grader, self-test,
mutations, calibration and scenario game (modules here), the games' registration files (games/) and the phase
scripts of the Qwen3.6 reference run (qwen3.6_self_trace/). Steps 1-2's benchmark-agnostic tools are in pipeline/.

This package shares its name with the SWE-bench evaluation harness (`pip install swebench`), which phases 1
and 6 run as `python -m swebench.harness.run_evaluation`. From the repository root this package is found
first, so it extends its search path with every other `swebench` folder on sys.path (pkgutil.extend_path, the
standard library's way for one package to span folders): `swebench.harness`, `swebench.collect`, ... still
import from the installed harness, beside this package's own modules, which none of the harness's share a
name with. The harness's top-level re-exports (`from swebench import KEY_INSTANCE_ID`) are not merged in:
import them from `swebench.harness...`, or run such code outside the repository, as phase 6 runs the harness
(in its output folder, where the installed package is the only `swebench`).
"""
import os
from pkgutil import extend_path

# extend_path also finds this folder again through "" or a relative sys.path entry: keep each folder once, absolute.
_folders: dict[str, str] = {}
for _folder in extend_path(__path__, __name__):
    _folders.setdefault(os.path.realpath(_folder), os.path.abspath(_folder))
__path__ = list(_folders.values())
del _folders, _folder
