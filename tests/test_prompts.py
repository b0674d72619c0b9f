"""Tests for render_pipeline.py and the Step-1/Step-2 prompts it renders.

Besides the CLI contract (exit codes, output paths, no partial files), three checks keep the
committed prompts honest:
  * drift: every filled-in prompt under prompts/<benchmark>/ equals a fresh render of its config;
  * existence: every command and repository path a prompt names exists in the repository;
  * inputs: every runs/ path a prompt names is written by a step of that prompt or of the benchmark's
    earlier stage prompt, or is the user's input, documented under "If the inputs are missing".
"""
from __future__ import annotations

import copy
import fnmatch
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

import render_pipeline
from common.validation import InputError

# Filled-in prompt -> (config that renders it, stage). Each config's first line gives the command.
FILLED_IN = {
    "prompts/tau-bench/capability_selection.md": ("configs/tau-bench/capability_selection.yaml", "capability"),
    "prompts/tau-bench/environment_generation.md": ("configs/tau-bench/environment_generation.yaml", "environment"),
    "prompts/swebench/capability_selection.md": ("configs/swebench/capability_selection.yaml", "capability"),
    "prompts/swebench/environment_generation.md": ("configs/swebench/environment_generation.yaml", "environment"),
}
GENERAL = {
    "configs/capability_selection.yaml": "capability",
    "configs/environment_generation.yaml": "environment",
}
ALL_CONFIGS = {**GENERAL, **{config: stage for config, stage in FILLED_IN.values()}}


def regenerate_command(prompt: str) -> str:
    config, stage = FILLED_IN[prompt]
    return f"python render_pipeline.py {config} --stage {stage} --out {prompt}"


# ---------------------------------------------------------------------------------------------
# Existence check: what a prompt names must exist.
#
# Rule for what is NOT checked here (outputs the agent creates while following the prompt):
#   1. anything with a placeholder: '<' or '{' (pipeline/swebench/<name>/..., capability_<name>_game.py);
#   2. anything under runs/: test_every_runs_path_is_produced_or_documented checks those;
#   3. what the prompt itself writes (see PRODUCED) and the output allow-list OUTPUT_PREFIXES.
# Globs ('*') must match at least one file. Commands under "If the inputs are missing" run third-party
# tools (tau2, mini-swe-agent, the SWE-bench harness): there only repository modules are checked.
# ---------------------------------------------------------------------------------------------
PYTHON_MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
PYTHON_SCRIPT = re.compile(r"\bpython3? ((?:[\w.-]+/)*[\w.-]+\.py)\b")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:pipeline|train|configs|prompts|moe_gate|benchmarks|scripts)/[^\s`'\"),;:]*"
    r"|game_registry\.py|render_pipeline\.py)"
)
# What a prompt tells the agent to write: the file after an output flag, `mkdir -p`, a shell redirect, or
# prose such as "Save `P`", "write P", "note ... in `P`", "... to `P`".
PRODUCED = re.compile(
    r"(?:--out|--export|--json-output|--output|mkdir -p|>)\s+([\w./<>{}*-]+)"
    r"|(?:[Ss]ave|[Ww]rite|[Ww]rites|note [^`\n]* in|to)\s+`([^`\s]+)`"
    r"|[Ww]rite\s+((?:runs|pipeline)/[\w./<>*-]+)"
)
OUTPUT_PREFIXES = ("prompts/rendered/",)
REPO_PACKAGES = ({p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
                 | {p.stem for p in REPO.glob("*.py")})
# The installed SWE-bench harness (`pip install swebench`, on the user's GPU machine) shares the top-level name
# with this repository's swebench/ package, which extends its path to it (swebench/__init__.py).
HARNESS_MODULES = ("swebench.harness.", "swebench.collect.", "swebench.inference.")
MISSING_INPUTS = re.compile(r"^### If the inputs are missing\n(.*?)(?=^#{2,3} )", re.S | re.M)


def produced_paths(text: str) -> set[str]:
    """Every path a prompt tells the agent to write (PRODUCED), normalized (see `normalize`); only paths with
    a folder that do not start with a wildcard, so a stray word never covers everything."""
    paths = {normalize(next(group for group in match if group)) for match in PRODUCED.findall(text)}
    return {path for path in paths if "/" in path and not path.startswith("*")}


def normalize(path: str) -> str:
    """A path pattern: placeholders (<name>, NN, run numbers) become '*', trailing '/' and '.' go."""
    path = re.sub(r"<[^>]*>", "*", path.strip().rstrip(".,;:)").rstrip("/"))
    return re.sub(r"run_(?:NN|\d+)", "run_*", path)


def covers(produced: str, named: str) -> bool:
    """A produced path covers a named one when they match as patterns, or the named one is a folder above it."""
    return (fnmatch.fnmatch(named, produced) or fnmatch.fnmatch(produced, named)
            or fnmatch.fnmatch(produced, named + "/*") or produced.startswith(named + "/"))


def is_output(path: str, produced: set[str] = frozenset()) -> bool:
    """True for paths the prompt tells the agent to create (see the rule above)."""
    return (
        "<" in path or "{" in path or path.startswith("runs/") or path.startswith(OUTPUT_PREFIXES)
        or any(covers(p, normalize(path)) for p in produced)
    )


def references(text: str, earlier: str = "") -> set[tuple[str, str]]:
    """(kind, target) pairs a prompt names: ('module', 'pipeline._summarize'), ('path', 'game_registry.py').

    What this prompt or its `earlier` stage prompt writes is left out. In the "If the inputs are missing"
    section only repository modules count (it runs third-party tools)."""
    produced = produced_paths(text) | produced_paths(earlier)
    outside = MISSING_INPUTS.sub("", text)
    found = {("module", m) for m in PYTHON_MODULE.findall(outside)}
    found |= {("module", m) for m in PYTHON_MODULE.findall(text) if m.split(".")[0] in REPO_PACKAGES}
    found |= {("path", p) for p in PYTHON_SCRIPT.findall(text)}
    found |= {("path", p.rstrip(".")) for p in REPO_PATH.findall(text)}
    return {(kind, target) for kind, target in found if not is_output(target, produced)}


def missing_reference(kind: str, target: str) -> str | None:
    """None when the reference resolves, else a description of what is missing."""
    if kind == "module":
        top = target.split(".")[0]
        if target.startswith(HARNESS_MODULES):
            return None
        if top in REPO_PACKAGES:  # a repository module: its file or package must exist
            base = REPO.joinpath(*target.split("."))
            if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                return None
            return f"python -m {target} -> {base.relative_to(REPO)}.py"
        if importlib.util.find_spec(top) is not None:  # an installed tool such as pytest
            return None
        return f"python -m {target} -> not a repository module and not installed"
    if "*" in target:
        return None if list(REPO.glob(target)) else f"{target} (glob matches nothing)"
    return None if (REPO / target).exists() else target


def prompt_sources() -> dict[str, str]:
    """Every prompt the existence test reads: filled-in files and renders of the general configs."""
    sources = {prompt: (REPO / prompt).read_text(encoding="utf-8") for prompt in FILLED_IN}
    for config, stage in GENERAL.items():
        sources[f"render of {config}"] = render_pipeline.render(REPO / config, stage)
    return sources


def earlier_stage(source: str) -> str:
    """The Step-1 prompt a Step-2 prompt follows (same benchmark), or "" for a Step-1 prompt."""
    if "environment" not in source:
        return ""
    return prompt_sources()[source.replace("environment_generation", "capability_selection")]


ALL_SOURCES = sorted([*FILLED_IN, *(f"render of {c}" for c in GENERAL)])
RUNS_PATH = re.compile(r"(?<![\w./-])(runs/[^\s`'\"),;:]*)")


@pytest.mark.parametrize("source", ALL_SOURCES)
def test_every_named_command_and_path_exists(source):
    text = prompt_sources()[source]
    refs = references(text, earlier_stage(source))
    assert refs, f"{source}: found no commands at all; the extractor is broken"
    missing = sorted(filter(None, (missing_reference(kind, target) for kind, target in refs)))
    assert not missing, f"{source} names things that do not exist in the repo:\n  " + "\n  ".join(missing)


@pytest.mark.parametrize("source", ALL_SOURCES)
def test_every_runs_path_is_produced_or_documented(source):
    """A prompt may name a file under runs/ only if a step writes it (this prompt, or the Step-1 prompt a
    Step-2 prompt follows) or it is the user's input, documented under "If the inputs are missing"."""
    text = prompt_sources()[source]
    earlier = earlier_stage(source)
    produced = produced_paths(text) | produced_paths(earlier)
    documented = {normalize(path) for section in MISSING_INPUTS.findall(text + "\n## end\n" + earlier + "\n## end\n")
                  for path in RUNS_PATH.findall(section)}
    if "environment" not in source:
        assert MISSING_INPUTS.search(text), f"{source}: no 'If the inputs are missing' section"
    named = sorted({normalize(path) for path in RUNS_PATH.findall(text)})
    assert named, f"{source}: names no runs/ path at all; the extractor is broken"
    unaccounted = [path for path in named
                   if not any(covers(p, path) for p in produced)
                   and not any(covers(d, path) or path.startswith(d + "/") for d in documented)]
    assert not unaccounted, (f"{source} names runs/ paths that no step writes and that are not documented as the "
                             "user's input:\n  " + "\n  ".join(unaccounted))


def test_runs_path_check_catches_an_input_nothing_produces():
    text = ("## Inputs\nRead `runs/x/eval/base/results.json`.\n## Step 1\n"
            "python -m pipeline._summarize runs/x/eval/base/results.json --out runs/x/select/summary.jsonl\n")
    named = {normalize(path) for path in RUNS_PATH.findall(text)}
    produced = produced_paths(text)
    assert named == {"runs/x/eval/base/results.json", "runs/x/select/summary.jsonl"}
    assert [p for p in named if not any(covers(q, p) for q in produced)] == ["runs/x/eval/base/results.json"]
    documented = text + "### If the inputs are missing\nRun it; save runs/x/eval/base/results.json.\n## end\n"
    assert [normalize(p) for section in MISSING_INPUTS.findall(documented)
            for p in RUNS_PATH.findall(section)] == ["runs/x/eval/base/results.json"]


def test_reference_extractor_finds_tools_and_skips_outputs():
    text = (
        "Run `python -m pipeline._summarize a.json --out runs/x/select/summary.jsonl` and\n"
        "python pipeline/aggregate_capabilities.py --export pipeline/selected_capabilities.json;\n"
        "read game_registry.py, then write capability_<name>_game.py and\n"
        "pipeline/swebench/<name>/scenarios_parsed.json; see configs/nope.yaml.\n"
        "(cd $T && python -m pytest -q); python - <<'EOF' and python -c \"import x\"\n"
    )
    assert references(text) == {
        ("module", "pipeline._summarize"),
        ("module", "pytest"),
        ("path", "pipeline/aggregate_capabilities.py"),
        ("path", "game_registry.py"),
        ("path", "configs/nope.yaml"),
    }
    assert missing_reference("path", "configs/nope.yaml") == "configs/nope.yaml"
    assert missing_reference("module", "pytest") is None
    assert missing_reference("module", "pipeline.no_such_tool") == "python -m pipeline.no_such_tool -> pipeline/no_such_tool.py"
    assert missing_reference("module", "common.io") is None


# ---------------------------------------------------------------------------------------------
# Drift and config hygiene
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", sorted(FILLED_IN))
def test_filled_in_prompt_matches_fresh_render(prompt):
    config, stage = FILLED_IN[prompt]
    committed = (REPO / prompt).read_text(encoding="utf-8")
    fresh = render_pipeline.render(REPO / config, stage)
    assert committed == fresh, f"{prompt} is out of date with its config/template; regenerate with:\n  {regenerate_command(prompt)}"


@pytest.mark.parametrize("config", sorted(ALL_CONFIGS))
def test_config_first_line_is_its_render_command(config):
    first = (REPO / config).read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# Render: "), f"{config}: first line must be '# Render: <command>'"
    argv = shlex.split(first[len("# Render: "):])
    assert argv[:3] == ["python", "render_pipeline.py", config], f"{config}: command does not render this file: {first}"
    stage = ALL_CONFIGS[config]
    assert argv[3:5] == ["--stage", stage]
    assert yaml.safe_load((REPO / config).read_text(encoding="utf-8"))["stage"] == stage
    expected_out = [["--out", p] for p, (c, _) in FILLED_IN.items() if c == config]
    assert argv[5:] == (expected_out[0] if expected_out else []), f"{config}: --out does not match its filled-in prompt"


def test_every_benchmark_config_has_a_filled_in_prompt():
    on_disk = {p.relative_to(REPO).as_posix() for d in ("tau-bench", "swebench") for p in (REPO / "configs" / d).glob("*.yaml")}
    assert on_disk == {config for config, _ in FILLED_IN.values()}


def _key_paths(node, prefix=()):
    """Dotted key paths of nested mappings (list items are not descended into)."""
    for key, value in node.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _key_paths(value, prefix + (key,))


# ~0.6 s each: the tau-bench configs and the swebench generation config run with `-m slow`.
@pytest.mark.parametrize("config", [pytest.param(c, marks=pytest.mark.slow) if c.startswith("configs/tau-bench/")
                                    or c == "configs/swebench/environment_generation.yaml" else c
                                    for c in sorted(ALL_CONFIGS)])
def test_every_config_key_is_required_and_named_when_missing(config, tmp_path, capsys):
    """Deleting any key the template uses stops the render with exit 2, naming that key: so no
    config carries dead keys, and a typo in a config can never leave a hole in a prompt."""
    data = yaml.safe_load((REPO / config).read_text(encoding="utf-8"))
    optional = {("stage",), ("template",)}  # read by render_pipeline itself, with defaults
    not_named = []
    for path in _key_paths(data):
        if path in optional:
            continue
        broken = copy.deepcopy(data)
        parent = broken
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        config_file = tmp_path / "broken.yaml"
        config_file.write_text(yaml.safe_dump(broken, allow_unicode=True), encoding="utf-8")
        out = tmp_path / "out.md"
        code = render_pipeline.main([str(config_file), "--stage", ALL_CONFIGS[config], "--out", str(out)])
        err = capsys.readouterr().err
        if code != 2 or f"'{path[-1]}'" not in err or out.exists():
            not_named.append(f"{'.'.join(path)}: exit {code}, stderr {err.strip()!r}")
    assert not not_named, f"{config}: keys whose removal is not reported:\n  " + "\n  ".join(not_named)


# ---------------------------------------------------------------------------------------------
# Content: the prompts carry the config's numbers and the right branch per benchmark kind
# ---------------------------------------------------------------------------------------------
def _copy_config(tmp_path, config, **changes):
    data = yaml.safe_load((REPO / config).read_text(encoding="utf-8"))
    data.update(changes)
    path = tmp_path / Path(config).name
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def test_capability_prompt_uses_config_values(tmp_path):
    path = _copy_config(tmp_path, "configs/capability_selection.yaml", rho=0.15, delta=0.3, k=5, labelers=7,
                        run_name="demo2", results_files=["runs/demo2/eval/base/a.json", "runs/demo2/eval/base/b.json"])
    text = render_pipeline.render(path, "capability")
    assert "--rho 0.15 --delta 0.3 --k 5" in text
    assert "run_07.json" in text and "run_10.json" not in text
    assert "python -m pipeline._summarize runs/demo2/eval/base/a.json runs/demo2/eval/base/b.json" in text
    assert "--candidates runs/demo2/select/candidates.json" in text
    for field in ("lacking_failed", "present_failed", "na_failed", "lacking_passed", "present_passed", "na_passed"):
        assert field in text
    assert "{{" not in text and "{%" not in text


def test_one_results_file_given_as_a_string_is_one_path(tmp_path):
    # Before: the templates looped over the string, one character per "path" (`python -m pipeline._summarize r u n s`).
    for config, stage in (("configs/capability_selection.yaml", "capability"),
                          ("configs/environment_generation.yaml", "environment")):
        path = _copy_config(tmp_path, config, results_files="runs/demo2/eval/base/a.json")
        text = render_pipeline.render(path, stage)
        assert "`runs/demo2/eval/base/a.json`" in text or "_summarize runs/demo2/eval/base/a.json" in text, stage
        assert "`r`, `u`" not in text and " r u n s" not in text, stage


def test_validate_seeds_is_refused_outside_the_environment_stage(tmp_path, capsys):
    out = tmp_path / "prompt.md"
    code = render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "--out", str(out),
                                 "--run", "good", "--validate-seeds", "5"])
    assert code == 2 and "--validate-seeds sets validate_game's seeds" in capsys.readouterr().err
    assert not out.exists()


def test_summarize_flags_follow_the_config(tmp_path):
    path = _copy_config(tmp_path, "configs/capability_selection.yaml",
                        summarize={"max_chars": 900, "reports_dir": "runs/x/reports"})
    text = render_pipeline.render(path, "capability")
    assert "--max-chars 900 --reports runs/x/reports" in text
    plain = render_pipeline.render(REPO / "configs/capability_selection.yaml", "capability")
    assert "--max-chars" not in plain and "--reports" not in plain


def test_code_edit_prompt_uses_the_scenario_tools_and_tool_use_prompt_the_game_tools():
    swe = (REPO / "prompts/swebench/environment_generation.md").read_text(encoding="utf-8")
    tau = (REPO / "prompts/tau-bench/environment_generation.md").read_text(encoding="utf-8")
    game_tools = ("validate_game", "collect_rollouts", "calibrate_environment", "game_registry", "_game.py")
    assert [t for t in game_tools if t not in tau] == []
    for needed in ("python -m swebench.selftest runs/swebench/envs/<name>/scenarios_draft.json "
                   "--out pipeline/swebench/<name>/scenarios_parsed.json",
                   "python -m swebench.calibrate --capability <name>",
                   "TRACE_GAMES_DIRS=swebench/games python -m pipeline.validate_game capability_<name>",
                   "TRACE_GAMES_DIRS=swebench/games python -m train.collect_rollouts --game capability_<name>",
                   "swebench/games/capability_<name>_game.py", "python -m swebench.generate",
                   "VLLM_BASE_URLS=http://localhost:8000/v1 VLLM_MODEL=Qwen/Qwen3-30B-A3B-Instruct-2507"):
        assert needed in swe, needed
    assert "calibrate_environment" not in swe  # the tool-use band checker does not see per-scenario rates


# ---------------------------------------------------------------------------------------------
# The code-edit prompt's scenario format is the loader's (swebench/scenario.py)
# ---------------------------------------------------------------------------------------------
SWE_PROMPT = "prompts/swebench/environment_generation.md"


def _code_edit_step(number: int) -> str:
    text = (REPO / SWE_PROMPT).read_text(encoding="utf-8")
    start = text.index(f"## Step {number}")
    return text[start:text.index("\n## ", start + 1)]


def _example_scenarios() -> list:
    blocks = re.findall(r"```json\n(.*?)```", _code_edit_step(3), re.S)
    assert len(blocks) == 1, "Step 3 of the code-edit prompt should show exactly one JSON example"
    return json.loads(blocks[0].replace("<name>", "boundary_handling"))


def test_code_edit_example_scenario_has_the_loaders_fields_and_loads(tmp_path):
    from swebench.generators.common import shortcut_patch
    from swebench.patches import apply_patch
    from swebench.scenario import REQUIRED_FIELDS, load_scenarios

    example = _example_scenarios()
    assert isinstance(example, list) and len(example) == 1
    data = example[0]
    assert [f for f in REQUIRED_FIELDS if f not in data] == []
    assert sorted(data) == sorted(REQUIRED_FIELDS)  # the loader rejects any other top-level field
    meta = data["metadata"]
    for key in ("hidden_test_files", "shortcut_patch", "mutations", "difficulty", "entry", "shortcut"):
        assert key in meta, key
    step = _code_edit_step(3)
    for name in (*REQUIRED_FIELDS, "metadata.hidden_test_files", "metadata.shortcut_patch", "metadata.entry",
                 "metadata.shortcut", "metadata.mutations"):
        assert f"`{name}`" in step, f"Step 3 does not explain `{name}`"
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps(example), encoding="utf-8")
    (scenario,) = load_scenarios(path)  # every validation rule of the format, the oracle patch applying included
    assert scenario.hidden_test_files() == ["tests/test_hidden_pricing.py"]
    assert scenario.target_test.split("::")[0] in scenario.test_files
    # the shortcut patch is what the helper the prompt names computes, and it applies
    entry, shortcut = meta["entry"], meta["shortcut"]
    assert shortcut_patch(scenario.files, entry["path"], entry["function"], shortcut["args"],
                          shortcut["expected"]) == meta["shortcut_patch"]
    hacked = apply_patch(scenario.files, meta["shortcut_patch"])
    assert hacked[entry["path"]] != scenario.files[entry["path"]]


def test_code_edit_prompt_drops_the_old_ad_hoc_format():
    text = (REPO / SWE_PROMPT).read_text(encoding="utf-8")
    steps = _code_edit_step(3) + _code_edit_step(4) + _code_edit_step(5)
    for old in ("buggy_snippet", "fail_to_pass", '"test_file":', '"issue":', '"hint":',
                "No repository tool samples the base model"):
        assert old not in text, old
    assert "git apply" not in steps and "mktemp" not in steps  # no hand-written self-test any more


def _heredocs(step: str) -> list[tuple[str, str]]:
    """(argument line, script) of each `python - ARGS <<'EOF'` block in a prompt step."""
    return re.findall(r"^python - (.*?) <<'EOF'\n(.*?)^EOF$", step, re.S | re.M)


def test_code_edit_calibration_snippets_run(tmp_path):
    """Step 5's scripts for a new capability (per-scenario success rates, mutations) work on the example."""
    from swebench.scenario import load_scenarios

    scenarios = tmp_path / "round_0_scenarios.json"
    scenarios.write_text(json.dumps(_example_scenarios()), encoding="utf-8")
    docs = _heredocs(_code_edit_step(5))
    rates = next(script for args, script in docs if "rollouts" in args)
    mutate = next(script for args, script in docs if "apply_primitives" in script)
    rollouts = tmp_path / "round_0_rollouts.json"
    sims = [{"task_id": "0", "sample_idx": k, "reward_info": {"reward": float(k < 3), "success": k < 3}}
            for k in range(4)]
    rollouts.write_text(json.dumps({"simulations": sims}), encoding="utf-8")
    done = subprocess.run([sys.executable, "-", str(rollouts), str(scenarios)], input=rates, text=True,
                          capture_output=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"boundary_handling_0001": 0.75}
    out = tmp_path / "round_0_mutated.json"
    done = subprocess.run([sys.executable, "-", str(scenarios), str(out), "boundary_handling_0001,other",
                           "add_decoys", "misleading_docstrings"], input=mutate, text=True, capture_output=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    (mutated,) = load_scenarios(out)
    assert [m["strategy"] for m in mutated.metadata["mutations"]] == ["add_decoys+misleading_docstrings"]
    assert mutated.files != load_scenarios(scenarios)[0].files


def test_code_edit_game_file_registers_a_scenario_game(tmp_path, monkeypatch):
    """The game file Step 4 tells the agent to write for a new capability builds the scenario game over the
    capability's scenarios file."""
    import game_registry

    scenarios = tmp_path / "scenarios_parsed.json"
    scenarios.write_text(json.dumps(_example_scenarios()), encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", _code_edit_step(4), re.S)
    default = 'str(REPO_ROOT / "pipeline/swebench/<name>/scenarios_parsed.json")'
    assert default in block
    code = block.replace(default, repr(str(scenarios))).replace("<name>", "boundary_handling")
    game_file = tmp_path / "capability_boundary_handling_game.py"
    game_file.write_text(code, encoding="utf-8")
    registered = []
    monkeypatch.setattr(game_registry, "register_game", registered.append)  # keep the real registry clean
    module_spec = importlib.util.spec_from_file_location("prompt_example_game", game_file)
    module = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, "prompt_example_game", module)  # dataclasses look their module up
    module_spec.loader.exec_module(module)
    (spec,) = registered
    assert spec.name == "capability_boundary_handling" and spec.capability == "boundary_handling"
    assert "hard_code_the_example" in [p.name for p in spec.probes]
    game = spec.make_env()
    game.reset(0)
    assert game.workspace.scenario.id == "boundary_handling_0001"
    assert "tests/test_hidden_pricing.py" not in game.workspace.files  # hidden tests stay hidden
    # mini-swe-agent's format by default (what SWE-bench evaluation uses): no tool schemas, one bash block a turn
    assert game.config.interface == "bash" and not game.get_tool_schemas()


def test_unknown_environment_kind_names_the_missing_template(tmp_path, capsys):
    path = _copy_config(tmp_path, "configs/environment_generation.yaml", environment_kind="board_game")
    assert render_pipeline.main([str(path), "--stage", "environment", "--out", str(tmp_path / "o.md")]) == 2
    err = capsys.readouterr().err
    assert "general/_environment_board_game.md.j2" in err and str(path) in err
    assert not (tmp_path / "o.md").exists()


# ---------------------------------------------------------------------------------------------
# CLI contract
# ---------------------------------------------------------------------------------------------
GENERAL_CAPABILITY = REPO / "configs/capability_selection.yaml"


def test_out_writes_exactly_the_render(tmp_path, capsys):
    out = tmp_path / "nested" / "prompt.md"
    assert render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_pipeline.render(GENERAL_CAPABILITY, "capability")
    assert capsys.readouterr().out.strip() == str(out)


def test_default_output_is_prompts_rendered_run_stage(tmp_path, monkeypatch):
    prompt = render_pipeline.render_prompt(GENERAL_CAPABILITY, "capability")
    assert prompt.default_output == REPO / "prompts/rendered/my_benchmark_capability.md"
    # Write into a temporary folder instead of the shared working tree.
    monkeypatch.setattr(render_pipeline, "RENDERED_DIR", tmp_path / "rendered")
    assert render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability"]) == 0
    written = tmp_path / "rendered" / "my_benchmark_capability.md"
    assert written.read_text(encoding="utf-8") == prompt.text
    assert [p.name for p in (tmp_path / "rendered").iterdir()] == [written.name]  # no temp file left


def test_missing_key_exits_2_names_key_and_writes_nothing(tmp_path, capsys):
    data = yaml.safe_load(GENERAL_CAPABILITY.read_text(encoding="utf-8"))
    del data["rho"]
    del data["benchmark"]["pass_definition"]
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "out.md"
    assert render_pipeline.main([str(config), "--stage", "capability", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(config) in err and "missing config key" in err
    assert "'pass_definition'" in err or "'rho'" in err
    assert "capability_selection.md.j2:" in err  # the template line that needed it
    assert not out.exists() and list(tmp_path.iterdir()) == [config]

    out.write_text("previous render\n", encoding="utf-8")  # a failed render leaves an old file alone
    assert render_pipeline.main([str(config), "--stage", "capability", "--out", str(out)]) == 2
    assert out.read_text(encoding="utf-8") == "previous render\n"


def test_bad_stage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "training"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(InputError, match="unknown stage"):
        render_pipeline.render(GENERAL_CAPABILITY, "training")


def test_config_for_other_stage_exits_2_naming_the_file(tmp_path, capsys):
    out = tmp_path / "o.md"
    assert render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "environment", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(GENERAL_CAPABILITY) in err and "--stage capability" in err
    assert not out.exists()


@pytest.mark.parametrize("content, expected", [
    ("run_name: [unclosed\n", "invalid YAML at line"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("run_name: ../escape\n", "run_name"),
    ("run_name: ok\ntemplate: general/no_such.md.j2\n", "general/no_such.md.j2"),
])
def test_bad_config_exits_2_naming_the_file(tmp_path, capsys, content, expected):
    config = tmp_path / "bad.yaml"
    config.write_text(content, encoding="utf-8")
    out = tmp_path / "o.md"
    assert render_pipeline.main([str(config), "--stage", "capability", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(config) in err and expected in err
    assert not out.exists()


def test_missing_config_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert render_pipeline.main([str(missing), "--stage", "capability"]) == 2
    assert f"{missing}: config file not found" in capsys.readouterr().err


def test_script_runs_from_another_directory(tmp_path):
    """The real entry point, from a foreign cwd: templates are found relative to the script."""
    out = tmp_path / "p.md"
    result = subprocess.run(
        [sys.executable, str(REPO / "render_pipeline.py"), str(REPO / "configs/environment_generation.yaml"),
         "--stage", "environment", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8") == render_pipeline.render(REPO / "configs/environment_generation.yaml", "environment")


# ---------------------------------------------------------------------------------------------
# Set-up, inputs, the selected list's home, neutral examples, labeling examples, the vLLM block
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ALL_SOURCES)
def test_every_prompt_starts_with_the_repos_set_up(source):
    text = prompt_sources()[source]
    setup = text[text.index("## Step 0: set up the environment"):]
    assert setup.index("make venv") < setup.index(". .venv/bin/activate") < setup.index("set-up OK")
    assert text.index("## Step 0: set up") < text.index("python -m pipeline.")  # before any command needs it


def test_each_benchmark_exports_its_own_selected_list_and_step_2_reads_it():
    exports = {}
    for folder in ("tau-bench", "swebench"):
        capability = (REPO / "prompts" / folder / "capability_selection.md").read_text(encoding="utf-8")
        environment = (REPO / "prompts" / folder / "environment_generation.md").read_text(encoding="utf-8")
        exported = re.search(r"--export (\S+)", capability).group(1)
        exports[folder] = exported
        read = set(re.findall(r"python -m pipeline\.capabilities \w+ .*?--file (\S+)", environment))
        assert read == {exported}, (folder, read)
        assert "python -m pipeline.capabilities next --json --claim --file" in environment
    assert exports == {"tau-bench": "pipeline/selected_capabilities.json",
                       "swebench": "pipeline/swebench/selected_capabilities.json"}


PAPER_TAU2_CAPABILITIES = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
                           "tool_calling_precision")


@pytest.mark.parametrize("config", sorted(c for c, stage in ALL_CONFIGS.items() if stage == "capability"))
def test_granularity_examples_do_not_name_the_papers_answers(config):
    """Examples of the right granularity must not be the capabilities the paper found: they prime the answer."""
    names = {e["name"] for e in yaml.safe_load((REPO / config).read_text(encoding="utf-8"))["granularity_examples"]}
    assert not names & set(PAPER_TAU2_CAPABILITIES), names


@pytest.mark.parametrize("prompt", sorted(p for p in FILLED_IN if "capability" in p))
def test_labeler_brief_has_worked_examples_and_the_export_fields(prompt):
    text = (REPO / prompt).read_text(encoding="utf-8")
    brief = text[text.index("You are labeler ATTEMPT"):]
    examples = re.findall(r"^- (failed|passed);.*?-> (NA|PRESENT|LACKING)", brief, re.M | re.S)
    assert {label for _, label in examples} == {"NA", "PRESENT", "LACKING"}
    assert ("passed", "LACKING") in examples  # LACKING on a passed trajectory is possible and counts
    for field in ("skill", "description", "mean_cov", "std_cov", "mean_delta", "std_delta", "n_runs_passed",
                  "n_runs_total", "passes_consistency", "example_failed_cases", "status"):
        assert f"`{field}`" in text[text.index("## Phase 3"):], field


def test_tool_use_calibration_samples_through_a_vllm_server():
    text = (REPO / "prompts/tau-bench/environment_generation.md").read_text(encoding="utf-8")
    step = text[text.index("## Step 5"):text.index("## Last step")]
    serve = step.index(".venv-vllm/bin/vllm serve Qwen/Qwen3-30B-A3B-Instruct-2507 --port 5050")
    urls = step.index("export VLLM_BASE_URLS=http://127.0.0.1:5050 VLLM_MODEL=Qwen/Qwen3-30B-A3B-Instruct-2507")
    collect = step.index("python -m train.collect_rollouts")
    assert serve < urls < collect
    assert "nvidia-smi --query-gpu" in step and "CUDA_VISIBLE_DEVICES=<" in step  # gpu_device: null
    assert "    --logprobs-mode processed_logprobs \\" in step  # serve_args, one flag per line
    assert "kill $(cat runs/tau-bench/envs/<name>/vllm.pid)" in step
    assert "--group-size 16" in step


def test_vllm_block_follows_the_config(tmp_path):
    path = _copy_config(tmp_path, "configs/environment_generation.yaml", gpu_device="2,3", port=8123,
                        hint_ratio="0.25-0.5",
                        vllm={"serve_args": "--tensor-parallel-size 2 --served-model-name base "
                                            "--chat-template-kwargs '{\"enable_thinking\": false}'",
                              "env": {"HF_HOME": "/data/hf"}})
    text = render_pipeline.render(path, "environment")
    assert "export CUDA_VISIBLE_DEVICES=2,3\nexport HF_HOME=/data/hf\n" in text and "nvidia-smi --query" not in text
    assert ".venv-vllm/bin/vllm serve my-org/my-agent-model --port 8123 \\\n    --tensor-parallel-size 2 \\\n" in text
    assert "    --chat-template-kwargs '{\"enable_thinking\": false}' \\\n" in text
    assert "VLLM_BASE_URLS=http://127.0.0.1:8123 VLLM_MODEL=base" in text  # the name the server answers to
    assert "(4-8 of 16 samples)" in text


# ---------------------------------------------------------------------------------------------
# Compatibility with the reference implementation's flags and config keys
# ---------------------------------------------------------------------------------------------
def test_output_dir_flag_and_file_prefix(tmp_path, capsys):
    out_dir = tmp_path / "rendered"
    assert render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "-o", str(out_dir)]) == 0
    written = out_dir / "my_benchmark_capability.md"
    assert written.read_text(encoding="utf-8") == render_pipeline.render(GENERAL_CAPABILITY, "capability")
    assert capsys.readouterr().out.strip() == str(written)
    prefixed = _copy_config(tmp_path, "configs/capability_selection.yaml", file_prefix="exp1")
    assert render_pipeline.main([str(prefixed), "--stage", "capability", "--output-dir", str(out_dir)]) == 0
    assert (out_dir / "exp1_capability.md").is_file()
    with pytest.raises(SystemExit) as exc:
        render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "-o", str(out_dir), "--out", "x.md"])
    assert exc.value.code == 2
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "-o", str(a_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_reference_config_keys_mean_the_same(tmp_path, capsys):
    data = yaml.safe_load(GENERAL_CAPABILITY.read_text(encoding="utf-8"))
    ours = render_pipeline.render(GENERAL_CAPABILITY, "capability")
    theirs = dict(data, eval_results=data.pop("results_files")[0], n_runs=data.pop("labelers"),
                  k_consistency=data.pop("k"))
    for key in ("results_files", "labelers", "k"):
        theirs.pop(key, None)
    path = tmp_path / "reference_style.yaml"
    path.write_text(yaml.safe_dump(theirs, allow_unicode=True), encoding="utf-8")
    assert render_pipeline.render(path, "capability").replace(str(path), "X") == ours.replace(
        "configs/capability_selection.yaml", "X")
    both = _copy_config(tmp_path, "configs/capability_selection.yaml", n_runs=5)
    assert render_pipeline.main([str(both), "--stage", "capability", "--out", str(tmp_path / "o.md")]) == 2
    err = capsys.readouterr().err
    assert "'n_runs' (the reference's name for 'labelers') is 5 but 'labelers' is 10" in err
    assert not (tmp_path / "o.md").exists()


def test_selected_list_path_follows_the_config():
    assert render_pipeline.selected_list_path({"output_dir": "pipeline/swebench/"}) == \
        Path("pipeline/swebench/selected_capabilities.json")
    assert render_pipeline.selected_list_path({"output_dir": "pipeline/", "capabilities_file": "x/sel.json"}) == \
        Path("x/sel.json")
    assert render_pipeline.selected_list_path({}) == Path("pipeline/selected_capabilities.json")


@pytest.mark.parametrize("value, fragment", [(None, "'output_dir' is empty"), (3, "'output_dir' must be a path")])
def test_bad_output_dir_is_named(tmp_path, capsys, value, fragment):
    path = _copy_config(tmp_path, "configs/capability_selection.yaml", output_dir=value)
    assert render_pipeline.main([str(path), "--stage", "capability", "--out", str(tmp_path / "o.md")]) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "o.md").exists()


# Issue 28: values the prompt would state as nonsense, unknown keys, and an unknown agent exit 2 before any write.
@pytest.mark.parametrize("config, changes, message", [
    ("configs/capability_selection.yaml", {"labelers": -1}, "'labelers' must be an integer >= 1, got -1"),
    ("configs/capability_selection.yaml", {"k": 20, "labelers": 10}, "'k' must be an integer in [1, 10], got 20"),
    ("configs/capability_selection.yaml", {"rho": float("nan")}, "'rho' must be a finite number in [0, 1], got nan"),
    ("configs/capability_selection.yaml", {"delta": 2.0}, "'delta' must be a finite number in [-1, 1], got 2.0"),
    ("configs/capability_selection.yaml", {"candidates": {"min": 9, "max": 3}}, "candidates min 9 is above max 3"),
    ("configs/capability_selection.yaml", {"lablers": 10}, "unknown config key 'lablers' (did you mean 'labelers'?)"),
    ("configs/environment_generation.yaml", {"calibration_band": {"low": 0.9, "high": 0.1}},
     "calibration_band low 0.9 is above high 0.1"),
    ("configs/environment_generation.yaml", {"port": 99999}, "'port' must be an integer in [1, 65535], got 99999"),
    ("configs/environment_generation.yaml", {"hint_ratio": "1.5"}, "'hint_ratio' must be a share in [0, 1)"),
    ("configs/environment_generation.yaml", {"rollouts": {"seeds": 100, "samples": 0, "temperature": 1.0}},
     "'rollouts.samples' must be an integer >= 1, got 0"),
    ("configs/swebench/environment_generation.yaml",
     {"smoke_test": {"base_url": "localhost:8000/v1", "samples": 10, "temperature": 1.0}}, "add http://"),
    ("configs/capability_selection.yaml", {"results_files": []}, "'results_files' must be a results file's path"),
    ("configs/environment_generation.yaml", {"results_files": [3]}, "'results_files' must be a results file's path"),
])
def test_nonsense_values_and_unknown_keys_exit_2_and_write_nothing(config, changes, message, tmp_path, capsys):
    # Before: rendered "Spawn -1 subagents", "K = 20 of 10", "Cov(c) ≥ nan", an inverted band, port 99999, exit 0.
    path = _copy_config(tmp_path, config, **changes)
    stage = yaml.safe_load(path.read_text())["stage"]
    out = tmp_path / "prompt.md"
    assert render_pipeline.main([str(path), "--stage", stage, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and message in err and "Traceback" not in err, err
    assert not out.exists()


def test_an_unknown_agent_is_refused_before_the_prompt_is_written(tmp_path, capsys):
    # Before: the prompt was written, then "no agent" and exit 2.
    out = tmp_path / "prompt.md"
    code = render_pipeline.main([str(GENERAL_CAPABILITY), "--stage", "capability", "--out", str(out),
                                 "--run", "nosuchagent"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no agent 'nosuchagent'" in err and not out.exists()
