"""Stand-in coding agent that does what the stage prompt asks (tests/test_agent_runner.py).

capability (TRACE_STAGE): labels a few trajectories by a fixed rule into two run files and exports the
selection with the real aggregation (pipeline/selected_capabilities.json and its report, in the cwd).
environment: takes the next PENDING capability, saves the target tool schemas the prompt names (relative to
its cwd), writes a valid capability_<name>_game.py comparing against them and marks it DONE.
"""
from __future__ import annotations

import os
from pathlib import Path

from _common import (mark, read_prompt, save_target_schemas, selected_file, take_next_capability, target_schemas,
                     write_game)

from common.io import atomic_write_json
from pipeline.aggregate_capabilities import aggregate, write_outputs
from pipeline.labels_to_run import labels_to_run

OUTCOMES = [{"id": "f1", "passed": False}, {"id": "f2", "passed": False}, {"id": "p1", "passed": True},
            {"id": "p2", "passed": True}]


def select() -> None:
    read_prompt("TRACE Step 1")
    folder = Path("runs/stand-in/select/labels")
    paths = []
    for attempt in (1, 2):
        records = []
        for outcome in OUTCOMES:
            failed = not outcome["passed"]
            records.append({"trajectory_id": outcome["id"], "capability": "repeat_code",
                            "label": "LACKING" if failed else "PRESENT"})
            records.append({"trajectory_id": outcome["id"], "capability": "echo_back",
                            "label": "LACKING" if failed else "PRESENT"})
            records.append({"trajectory_id": outcome["id"], "capability": "small_talk", "label": "PRESENT"})
        paths.append(atomic_write_json(folder / f"run_0{attempt}.json", labels_to_run(records, OUTCOMES, attempt)))
    report = aggregate(paths, rho=0.1, delta=0.2, k=2)
    write_outputs(report, selected_file())
    print(f"stand-in agent: exported {report['selected']}", flush=True)


def environment() -> None:
    target = target_schemas(read_prompt("TRACE Step 2"))
    name = take_next_capability()
    save_target_schemas(target)  # the tiny game offers no tools: an empty list holds them all
    write_game(name, oracle_ok=True, target=target)
    mark(name, "DONE")


if __name__ == "__main__":
    if os.environ["TRACE_STAGE"] == "capability":
        select()
    else:
        environment()
