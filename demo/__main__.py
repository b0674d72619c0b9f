"""python -m demo: the demo's command line (demo/run.py)."""
import sys

from common.cli import exit_code
from demo.run import main

sys.exit(exit_code(main))
