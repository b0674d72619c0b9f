"""Shared by the stand-in agents: read the prompt as a real agent gets it, write artifacts the way the prompt says."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from pipeline import capabilities

_SELECTED: list[Path] = []  # the selected-capabilities list the prompt names (read_prompt)
TEMPLATE = Path(__file__).with_name("tiny_game.py.txt")


def read_prompt(expected_title: str) -> str:
    """The prompt from stdin; exit 3 unless it is the rendered file the runner names and the right stage."""
    text = sys.stdin.read()
    prompt_file = Path(os.environ["TRACE_PROMPT_FILE"])
    if text != prompt_file.read_text(encoding="utf-8"):
        print(f"stand-in agent: stdin differs from {prompt_file}", flush=True)
        sys.exit(3)
    if expected_title not in text:
        print(f"stand-in agent: the prompt is not '{expected_title}'", flush=True)
        sys.exit(3)
    named = re.search(r"mark \S+ \S+ --file ([^\s`]+)", text)
    if named is None:
        print("stand-in agent: the prompt names no selected-capabilities list", flush=True)
        sys.exit(3)
    _SELECTED[:] = [Path(named.group(1))]  # relative to the agent's cwd, or absolute (--selected)
    print(f"stand-in agent: read {len(text)} characters of prompt", flush=True)
    return text


def selected_file() -> Path:
    """The selected-capabilities list the prompt read by `read_prompt` names."""
    return _SELECTED[0]


def take_next_capability() -> str:
    """What the Step-2 prompt says: `capabilities next --json --claim` (it marks the capability IN_PROGRESS)."""
    entry = capabilities.next_pending(capabilities.load_selected(selected_file()))
    if entry is None:
        print("all capabilities done", flush=True)
        sys.exit(0)
    name = entry["skill"]
    if name != os.environ.get("TRACE_CAPABILITY"):
        print(f"stand-in agent: next is {name}, runner expected {os.environ.get('TRACE_CAPABILITY')}", flush=True)
        sys.exit(4)
    if capabilities.main(["next", "--json", "--claim", "--file", str(selected_file())]) != 0:
        sys.exit(4)
    return name


def target_schemas(prompt: str) -> str:
    """The target tool schemas file the prompt names for `GameSpec(target=...)` (relative to the work folder)."""
    named = re.search(r'target="([^"]+)"', prompt)
    if named is None:
        print("stand-in agent: the prompt names no target tool schemas file", flush=True)
        sys.exit(3)
    return named.group(1)


def save_target_schemas(target: str, content: str = "[]") -> None:
    """The prompt's "save the target's tool schemas once" step, in the agent's cwd (the runner's --workdir)."""
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    print(f"stand-in agent: wrote {path} in {Path.cwd()}", flush=True)


def write_game(name: str, oracle_ok: bool, target: str = "") -> Path:
    """capability_<name>_game.py in the first TRACE_GAMES_DIRS folder (the tests' stand-in for the repo root);
    `target`: the GameSpec's target tool schemas file ("" for none)."""
    folders = [p for p in os.environ.get("TRACE_GAMES_DIRS", "").split(os.pathsep) if p]
    path = Path(folders[0] if folders else ".") / f"capability_{name}_game.py"
    text = (TEMPLATE.read_text(encoding="utf-8").replace("__NAME__", name).replace("__ORACLE_OK__", str(oracle_ok))
            .replace("__TARGET__", repr(target)))
    path.write_text(text, encoding="utf-8")
    print(f"stand-in agent: wrote {path}", flush=True)
    return path


def mark(name: str, status: str) -> None:
    capabilities.main(["mark", name, status, "--file", str(selected_file())])
