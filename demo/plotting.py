"""matplotlib for the demo's pictures: drawn to files only (the report's and the loop's plots share it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files only (no display here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path) -> Path:
    """Lay out, write as PNG and free the figure."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot().close(figure)
    return path
