"""Tests for render_pipeline.py and the Step-1/Step-2 prompts it renders.

Besides the CLI contract (exit codes, output paths, no partial files), two checks keep the
committed prompts honest:
  * drift: every filled-in prompt under prompts/<benchmark>/ equals a fresh render of its config;
  * existence: every command and repository path a prompt names exists in the repository.
"""
from __future__ import annotations

import copy
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # so the test also runs as `pytest` (not only `python -m pytest`)
    sys.path.insert(0, str(REPO))

import render_pipeline  # noqa: E402
from pipeline._io import InputError  # noqa: E402

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
# Rule for what is NOT checked (outputs the agent creates while following the prompt):
#   1. anything with a placeholder: '<' or '{' (pipeline/swebench/<name>/..., capability_<name>_game.py);
#   2. anything under runs/ (the run folder is all outputs) -- the path patterns below only match
#      paths that START with a repository folder, so runs/<x>/pipeline/... is never picked up;
#   3. the explicit output allow-list OUTPUT_PATHS / OUTPUT_PREFIXES.
# Globs ('*') must match at least one file.
# ---------------------------------------------------------------------------------------------
PYTHON_MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
PYTHON_SCRIPT = re.compile(r"\bpython3? ((?:[\w.-]+/)*[\w.-]+\.py)\b")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:pipeline|train|configs|prompts|moe_gate|benchmarks)/[^\s`'\"),;:]*"
    r"|game_registry\.py|render_pipeline\.py)"
)
# Step 1 writes these (aggregate_capabilities --export and its report); Step 2 reads the first.
OUTPUT_PATHS = {"pipeline/selected_capabilities.json", "pipeline/selected_capabilities_report.json"}
OUTPUT_PREFIXES = ("prompts/rendered/",)
REPO_PACKAGES = {p.name for p in REPO.iterdir() if p.is_dir()} | {p.stem for p in REPO.glob("*.py")}


def is_output(path: str) -> bool:
    """True for paths the prompt tells the agent to create (see the rule above)."""
    return (
        "<" in path or "{" in path or path.startswith("runs/")
        or path in OUTPUT_PATHS or path.startswith(OUTPUT_PREFIXES)
    )


def references(text: str) -> set[tuple[str, str]]:
    """(kind, target) pairs a prompt names: ('module', 'pipeline._summarize'), ('path', 'game_registry.py')."""
    found = {("module", m) for m in PYTHON_MODULE.findall(text)}
    found |= {("path", p) for p in PYTHON_SCRIPT.findall(text)}
    found |= {("path", p.rstrip(".")) for p in REPO_PATH.findall(text)}
    return {(kind, target) for kind, target in found if not is_output(target)}


def missing_reference(kind: str, target: str) -> str | None:
    """None when the reference resolves, else a description of what is missing."""
    if kind == "module":
        top = target.split(".")[0]
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


@pytest.mark.parametrize("source", sorted([*FILLED_IN, *(f"render of {c}" for c in GENERAL)]))
def test_every_named_command_and_path_exists(source):
    text = prompt_sources()[source]
    refs = references(text)
    assert refs, f"{source}: found no commands at all; the extractor is broken"
    missing = sorted(filter(None, (missing_reference(kind, target) for kind, target in refs)))
    assert not missing, f"{source} names things that do not exist in the repo:\n  " + "\n  ".join(missing)


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
    assert missing_reference("module", "pipeline._io") is None


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


@pytest.mark.parametrize("config", sorted(ALL_CONFIGS))
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


def test_summarize_flags_follow_the_config(tmp_path):
    path = _copy_config(tmp_path, "configs/capability_selection.yaml",
                        summarize={"max_chars": 900, "reports_dir": "runs/x/reports"})
    text = render_pipeline.render(path, "capability")
    assert "--max-chars 900 --reports runs/x/reports" in text
    plain = render_pipeline.render(REPO / "configs/capability_selection.yaml", "capability")
    assert "--max-chars" not in plain and "--reports" not in plain


def test_code_edit_prompt_names_no_game_tools_and_tool_use_prompt_does():
    game_tools = ("validate_game", "collect_rollouts", "calibrate_environment", "game_registry", "_game.py")
    swe = (REPO / "prompts/swebench/environment_generation.md").read_text(encoding="utf-8")
    tau = (REPO / "prompts/tau-bench/environment_generation.md").read_text(encoding="utf-8")
    assert [t for t in game_tools if t in swe] == []
    assert [t for t in game_tools if t not in tau] == []
    assert "scenarios_parsed.json" in swe and "python -m pytest" in swe


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
