"""Stand-in coding agent that fails in the way FAKE_AGENT_MODE says (tests/test_agent_runner.py).

broken (default): capability -> a selected list not in the export schema; environment -> a game whose
  oracle loses (validate_game fails), marked DONE anyway.
not_done: environment -> a valid game, but the capability is left IN_PROGRESS.
bad_target: environment -> a valid game whose target tool schemas file (the prompt's, in the cwd) is not a
  list, marked DONE (validate_game fails, if it looks in the agent's work folder).
nothing: reads the prompt, writes nothing, exits 0.  crash: exits 5.  sleep: sleeps 60 s.
"""
from __future__ import annotations

import json
import os
import sys
import time

from _common import (mark, read_prompt, save_target_schemas, selected_file, take_next_capability, target_schemas,
                     write_game)

mode = os.environ.get("FAKE_AGENT_MODE", "broken")
stage = os.environ["TRACE_STAGE"]
prompt = read_prompt("TRACE Step 1" if stage == "capability" else "TRACE Step 2")
if mode == "crash":
    print("stand-in agent: boom", flush=True)
    sys.exit(5)
if mode == "sleep":
    time.sleep(60)
elif mode == "broken" and stage == "capability":
    selected_file().parent.mkdir(parents=True, exist_ok=True)
    selected_file().write_text(json.dumps([{"skill": "repeat_code", "status": "PENDING", "mean_delta": 0.5}]))
elif mode in ("broken", "not_done") and stage == "environment":
    name = take_next_capability()
    write_game(name, oracle_ok=mode == "not_done")
    if mode == "broken":
        mark(name, "DONE")
elif mode == "bad_target" and stage == "environment":
    target = target_schemas(prompt)
    name = take_next_capability()
    save_target_schemas(target, content='{"not": "a list"}')
    write_game(name, oracle_ok=True, target=target)
    mark(name, "DONE")
