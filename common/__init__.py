"""Helpers every step may import (Step 1's pipeline, Step 2's environments, Step 3's trainer, Step 4's gates).

io.py: atomic writes with the umask's mode, JSON/YAML reading that raises `InputError` naming the file,
and the checks every CLI runs at the door (`check_output_path`, `check_number`).
"""
