"""Where the repository is: configs/, prompts/, assets/ and the registered games are read from it.

The project is installed editable (`make venv`: `pip install -e .`), so its packages import from any folder;
the data folders stay in the repository, found from this file.
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
