"""The reference implementation's path of the trajectory summarizer: `python -m pipeline._summarize ...` (or
`python pipeline/_summarize.py ...`) runs pipeline/summarize.py's CLI, the module to import."""
import sys

from common.cli import exit_code
from pipeline.summarize import main

if __name__ == "__main__":
    sys.exit(exit_code(main))
