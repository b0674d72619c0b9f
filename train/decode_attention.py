"""The shared-prefix sampler's decoding attention on the CPU: one call per layer for all rows of a step.

A decoding step gives every row one new token, which attends to the shared prefix and to the columns its own slot
holds (train/shared_prefix.py). Rows hold different numbers of columns, and torch has no ragged attention on the
CPU: its fused kernel (`aten._scaled_dot_product_flash_attention_for_cpu`) takes dense batches, so the sampler
called it once per row (or per run of neighbouring rows of similar length): ~11 calls per layer per step on GRPO's
64-row storefront rollouts, which in the running sampler read keys and values at ~10 GB/s, plus Python and
thread-pool overhead per call. `csrc/decode_attention.cpp` does all rows in one call: one task per row and query
head reads the prefix (from cache: it is the same for every row) and the row's own columns once each, an exact
float32 softmax over each part, the two merged by their log-sum-exps. It is our own code because nothing in
torch, transformers or a CPU wheel of an inference engine does ragged decoding attention over a slot pool.

The kernel is compiled on first use (`make` sets up .venv with a first use) with torch's JIT extension builder
(ninja and the machine's C++ compiler; `-march=native`, so the build is keyed by this machine's CPU flags as well
as the source, the flags, the Python/torch versions and torch's folder) into torch's extension cache
(`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), from a copy of the source under ~/.cache/trace (so
clones at other paths using one .venv share the build): ~30 s once per environment and source. Where it cannot
be built (no compiler, no ninja) the sampler keeps torch's per-row kernel and says so once: same results, slower. `TRACE_DECODE_KERNEL=0` turns it off
(`kernel_available` reads it at each call; `HFBackend(decode_kernel=False)` for one backend).
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

SOURCE = Path(__file__).resolve().parent / "csrc" / "decode_attention.cpp"
# -ffast-math lets the compiler reorder and fuse the sums; -fno-finite-math-only keeps inf/NaN arithmetic honest
# (a poisoned score must show, not be optimised away). The exponentials are vectorised in the source itself.
# -fopenmp: at::parallel_for is OpenMP inlined from torch's headers (serial without it); the library it links,
# libgomp.so.1, resolves to the one torch has loaded already (same soname), so there is one thread pool.
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp")
LDFLAGS = ("-fopenmp",)
ENV_SWITCH = "TRACE_DECODE_KERNEL"
HEAD_DIMS = (32, 64, 128)

log = logging.getLogger(__name__)


def _machine_key() -> str:
    """What a build depends on beyond torch's own checks: the source, the flags, the CPU (-march=native), and
    where torch is installed: its build file names torch's include folders, so two virtual environments sharing
    one build (a clone with a copied .venv) rebuilt it (~30 s) each time the other had used it."""
    cpu_flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu_flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))),
                         "")
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS + LDFLAGS).encode(), platform.machine().encode(),
                 cpu_flags.encode(), torch.__version__.encode(), sys.version.encode(),
                 str(Path(torch.__file__).resolve().parent).encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def _source_copy(key: str) -> Path:
    """The kernel's source, copied to a folder named by its key. torch's builder writes the source's path into
    its build file, so compiling each clone's own file would rebuild the machine's one cache entry whenever a
    clone at another path loads it (~30 s each time); one path per key keeps one build per environment."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache / "trace" / "decode_attention" / key / SOURCE.name
    source = SOURCE.read_text()
    if not target.exists() or target.read_text() != source:
        atomic_write_text(target, source)
    return target


@functools.lru_cache(maxsize=1)
def _extension() -> ModuleType | None:
    from torch.utils import cpp_extension

    key = _machine_key()
    try:
        return cpp_extension.load(name=f"trace_decode_attention_{key}", sources=[str(_source_copy(key))],
                                  extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), verbose=False)
    except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning("decode-attention kernel not built (%s): sampling attends row by row with torch's kernel "
                    "(same results, slower)", first_line)
        return None


def kernel_available() -> bool:
    """The compiled kernel is loaded (built now if needed) and not switched off by TRACE_DECODE_KERNEL=0."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    return _extension() is not None


def kernel_applies(query: torch.Tensor, keys: torch.Tensor) -> bool:
    """The kernel handles these tensors (CPU, float32, a head size it is compiled for) and is available."""
    return (query.device.type == "cpu" and query.dtype == torch.float32 and keys.dtype == torch.float32
            and query.shape[-1] in HEAD_DIMS and keys.is_contiguous() and kernel_available())


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row a's query [Hq, D] over the prefix's columns and columns [0, lengths[a]) of slot slots[a], the two
    partial attentions merged by their log-sum-exps: query [A, Hq, D], keys/values [S, Hkv, C, D], prefix
    keys/values [Hkv, P, D] (P = 0: no prefix) -> (out [A, Hq, D], lse [A, Hq]), float32. Call only where
    `kernel_applies`."""
    extension = _extension()
    if extension is None:
        raise RuntimeError("the decode-attention kernel is not built; check kernel_applies() before calling")
    return tuple(extension.decode_attention(query.contiguous(), keys, values, slots, lengths,
                                            prefix_keys.contiguous(), prefix_values.contiguous(), float(scale)))
