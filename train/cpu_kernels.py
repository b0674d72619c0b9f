"""The sampler's compiled CPU kernels, built into one extension: decoding attention (train/decode_attention.py),
small-batch linear layers (train/small_linear.py) and RMSNorm (train/lean_forward.py); sources in train/csrc/.

Compiled on first use (`make` sets up .venv with a first use) with torch's JIT extension builder (ninja and the
machine's C++ compiler; `-march=native`, so the build is keyed by this machine's CPU flags as well as the sources,
the flags, the Python/torch versions and torch's folder) into torch's extension cache (`TORCH_EXTENSIONS_DIR`,
default ~/.cache/torch_extensions), from a copy of the sources under ~/.cache/trace (so clones at other paths
using one .venv share the build): ~45 s once per environment and source. Where it cannot be built (no compiler,
no ninja) the sampler keeps torch's kernels and says so once: same results, slower. `TRACE_CPU_KERNELS=0` turns
them off (`available` reads it at each call; `HFBackend(decode_kernel=False)` for one backend).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch

from common.io import atomic_write_text

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
SOURCES = ("decode_attention.cpp", "small_linear.cpp", "rms_norm.cpp", "decode_step.cpp", "bindings.cpp")  # compiled
HEADERS = ("kernels.h",)  # included
# -ffast-math lets the compiler reorder and fuse the sums; -fno-finite-math-only keeps inf/NaN arithmetic honest
# (a poisoned score must show, not be optimised away). The exponentials are vectorised in the source itself.
# -fopenmp: at::parallel_for is OpenMP inlined from torch's headers (serial without it); the library it links,
# libgomp.so.1, resolves to the one torch has loaded already (same soname), so there is one thread pool.
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp")
LDFLAGS = ("-fopenmp",)
ENV_SWITCH = "TRACE_CPU_KERNELS"

log = logging.getLogger(__name__)


def _machine_key() -> str:
    """What a build depends on beyond torch's own checks: the sources, the flags, the CPU (-march=native), and
    where torch is installed: its build file names torch's include folders, so two virtual environments sharing
    one build (a clone with a copied .venv) rebuilt it (~30 s) each time the other had used it."""
    cpu_flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu_flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))),
                         "")
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + (SOURCE_DIR / name).read_bytes())
    for part in (" ".join(CFLAGS + LDFLAGS).encode(), platform.machine().encode(), cpu_flags.encode(),
                 torch.__version__.encode(), sys.version.encode(), str(Path(torch.__file__).resolve().parent).encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def _source_copies(key: str) -> list[Path]:
    """The sources, copied to a folder named by their key. torch's builder writes the sources' paths into its
    build file, so compiling each clone's own files would rebuild the machine's one cache entry whenever a clone
    at another path loads it (~30 s each time); one path per key keeps one build per environment."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "trace" / "cpu_kernels" / key
    for name in SOURCES + HEADERS:
        target, source = folder / name, (SOURCE_DIR / name).read_text()
        if not target.exists() or target.read_text() != source:
            atomic_write_text(target, source)
    return [folder / name for name in SOURCES]


@functools.lru_cache(maxsize=1)
def _extension() -> ModuleType | None:
    from torch.utils import cpp_extension

    key = _machine_key()
    try:
        return cpp_extension.load(name=f"trace_cpu_kernels_{key}", sources=[str(p) for p in _source_copies(key)],
                                  extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), verbose=False)
    except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning("CPU kernels not built (%s): sampling runs torch's kernels (same results, slower)", first_line)
        return None


def available() -> bool:
    """The kernels are loaded (built now if needed) and not switched off by TRACE_CPU_KERNELS=0."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    return _extension() is not None


def extension() -> ModuleType:
    """The built extension; call only where `available()`."""
    if not available():
        raise RuntimeError("the CPU kernels are not built or switched off; check train.cpu_kernels.available() first")
    return _extension()
