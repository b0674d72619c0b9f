"""python -m pipeline.demo: the demo's command line (pipeline/demo/run.py)."""
import sys

from common.run_folder import exit_code
from pipeline.demo.run import main

sys.exit(exit_code(main))
