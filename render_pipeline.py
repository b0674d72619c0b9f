"""Render a TRACE stage prompt (Step 1 or Step 2) from a YAML config.

    python render_pipeline.py configs/capability_selection.yaml --stage capability
    python render_pipeline.py configs/environment_generation.yaml --stage environment [--out PATH | -o DIR]
    python render_pipeline.py CONFIG --stage capability|environment --run AGENT [--all]

`--run AGENT` then hands the rendered prompt to the coding agent named AGENT in configs/agents.yaml
(`--agents FILE`), logs its output under runs/<run_name>/agent_logs/ and checks the stage's artifact;
`--all` (environment) repeats it for every PENDING capability. See pipeline/agent_runner.py.

The config is a YAML mapping. Every key becomes a template variable; these are read by this
script itself:
  run_name     names the default output, prompts/rendered/<run_name>_<stage>.md (required)
  file_prefix  optional: replaces run_name in the output's file name (the reference's key)
  template     template path under prompts/ (optional; per-stage default in DEFAULT_TEMPLATES)
  stage        optional guard: when present it must equal --stage
  capabilities_file, else output_dir
               the selected-capabilities list (`selected_list_path`); the templates get it as `selected_list`
               (its report as `selected_list_report`), so the prompt exports the file `--run` checks
The output goes to --out FILE, or to -o/--output-dir DIR (the reference's flag) under the default
file name, or by default to prompts/rendered/.

Configs written for the reference implementation keep working where a key means the same thing:
`eval_results` is `results_files`, `n_runs` is `labelers`, `k_consistency` is `k` (giving both names
with different values is an error); `output_dir`, `gpu_device`, `port`, `hint_ratio` and
`vllm.serve_args` / `vllm.env` are read under their reference names. A reference config still needs
the keys our templates add (the benchmark description, ...): a missing one is named.

Templates are rendered with StrictUndefined, so a key the template needs but the config lacks is
an error that names the key instead of an empty hole in the prompt. Text config values may use
config keys themselves (`{{ model }}`), expanded by the template's `expand` filter. Rendering happens
fully in memory, and the output path is checked, before the atomic write, so a failed render or a
bad output path leaves no file behind.
"""
from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import jinja2
import jinja2.meta

from common.cli import cli_entry, exit_code
from common.io import atomic_write_text, check_output_path, load_yaml_mapping
from common.validation import InputError, check_url
from common.paths import REPO_ROOT

PROMPTS_DIR = REPO_ROOT / "prompts"
RENDERED_DIR = PROMPTS_DIR / "rendered"
STAGES = ("capability", "environment")
DEFAULT_TEMPLATES = {
    "capability": "general/capability_selection.md.j2",
    "environment": "general/environment_generation.md.j2",
}
# run_name becomes part of a file name: keep it to characters that are safe everywhere.
RUN_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The reference implementation's config key -> ours, for keys that mean the same thing.
REFERENCE_KEYS = {"eval_results": "results_files", "n_runs": "labelers", "k_consistency": "k"}
DEFAULT_SELECTED = Path("pipeline") / "selected_capabilities.json"
# jinja2 phrases an undefined variable as "'x' is undefined" and a missing mapping key as
# "'dict object' has no attribute 'x'" (or "... has no element 'x'" for subscripts).
_UNDEFINED_PATTERNS = (
    re.compile(r"^'(?P<name>[^']+)' is undefined"),
    re.compile(r"has no (?:attribute|element) '(?P<name>[^']+)'"),
)


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt rendered in memory, with where it goes by default."""

    text: str
    config_path: Path
    stage: str
    run_name: str
    template: str
    file_prefix: str | None = None

    @property
    def file_name(self) -> str:
        """<file_prefix or run_name>_<stage>.md"""
        return f"{self.file_prefix or self.run_name}_{self.stage}.md"

    @property
    def default_output(self) -> Path:
        """prompts/rendered/<file_prefix or run_name>_<stage>.md under the repository root."""
        return RENDERED_DIR / self.file_name


def load_config(config_path: str | Path) -> dict[str, Any]:
    """Read a YAML config file and return its top-level mapping, with the reference implementation's key
    names mapped onto ours (REFERENCE_KEYS); problems raise InputError."""
    return apply_reference_keys(load_yaml_mapping(config_path), config_path)


def apply_reference_keys(config: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """Set our key from the reference's (eval_results -> results_files, ...); InputError when both are given
    with different values. `eval_results` and `results_files` may be one path or a list, as in the reference
    (one path becomes a list of it: the templates loop over the paths)."""
    config = dict(config)
    if isinstance(config.get("results_files"), str):
        config["results_files"] = [config["results_files"]]
    for theirs, ours in REFERENCE_KEYS.items():
        if theirs not in config:
            continue
        value = config[theirs]
        if theirs == "eval_results" and isinstance(value, str):
            value = [value]
        if ours in config and config[ours] != value:
            raise InputError(f"{source}: '{theirs}' (the reference's name for '{ours}') is {config[theirs]!r} but "
                             f"'{ours}' is {config[ours]!r}; keep one of the two")
        config[ours] = value
    return config


def selected_list_path(config: dict[str, Any]) -> Path:
    """The selected-capabilities list a config's prompts use: `capabilities_file` if set, else
    `<output_dir>/selected_capabilities.json`, else pipeline/selected_capabilities.json (repo-relative)."""
    if config.get("capabilities_file"):
        return Path(str(config["capabilities_file"]))
    if config.get("output_dir"):
        return Path(str(config["output_dir"])) / "selected_capabilities.json"
    return DEFAULT_SELECTED


def _display_path(path: Path) -> str:
    """Repo-relative POSIX path when inside the repo, so renders do not depend on the cwd."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _template_line(tb: TracebackType | None) -> str:
    """Template file and line of the innermost frame that belongs to a template, if any."""
    found = ""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            found = f"{_display_path(Path(filename))}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _missing_key_message(err: jinja2.UndefinedError, config_path: Path, template: str) -> str:
    """Turn jinja's UndefinedError into 'config lacks key X' with the template line."""
    message = str(err.message or err)
    name = None
    for pattern in _UNDEFINED_PATTERNS:
        match = pattern.search(message)
        if match:
            name = match.group("name")
            break
    where = _template_line(err.__traceback__) or template
    if name is None:
        return f"{config_path}: template {where} failed: {message}"
    return f"{config_path}: missing config key '{name}' (needed by template {where})"


@jinja2.pass_context
def _expand(context: jinja2.runtime.Context, text: Any) -> str:
    """Render a config value as a template with the same variables (`{{ model }}` inside `results_howto`)."""
    return context.environment.from_string(str(text)).render(context.get_all())


def _cli_flags(args: Any) -> list[str]:
    """A command line's flags one per item, each with its values ("--a 1 --b" -> ["--a 1", "--b"]); values
    are shell-quoted where needed. Renders `vllm.serve_args` one flag per line, as the reference does."""
    if args is None:
        return []
    try:
        tokens = shlex.split(str(args))
    except ValueError as err:
        raise InputError(f"cannot split the command-line flags {args!r}: {err}") from None
    flags: list[str] = []
    for token in tokens:
        if (token.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?", token)) or not flags:  # "-1" is a value
            flags.append(shlex.quote(token))
        else:
            flags[-1] += " " + shlex.quote(token)
    return flags


def _served_model_name(args: Any, model: str) -> str:
    """The name a vLLM server started with these serve flags answers to: --served-model-name, else the model."""
    try:
        tokens = shlex.split(str(args or ""))
    except ValueError as err:
        raise InputError(f"cannot split the command-line flags {args!r}: {err}") from None
    for index, token in enumerate(tokens):
        if token == "--served-model-name" and index + 1 < len(tokens):
            return tokens[index + 1]
        if token.startswith("--served-model-name="):
            return token.split("=", 1)[1]
    return model


def _share_of(ratio: Any, group: int) -> str:
    """'0.25-0.5' of 16 -> '4-8 of 16'; a single share -> 'N of G'; anything else is shown as given."""
    try:
        shares = [float(part) for part in str(ratio).split("-")]
        counts = sorted({int(share * int(group)) for share in shares})
    except ValueError:
        return f"{ratio} of {group}"
    if len(shares) > 2 or not all(0.0 <= share <= 1.0 for share in shares):
        return f"{ratio} of {group}"
    return f"{'-'.join(map(str, counts))} of {group}"


def _environment() -> jinja2.Environment:
    """Jinja environment rooted at prompts/: strict, trailing newline kept, tidy blocks."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PROMPTS_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        # Block tags on their own line leave no blank line or indentation behind.
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(expand=_expand, cli_flags=_cli_flags, served_model_name=_served_model_name,
                       share_of=_share_of)
    return env


# Keys this script reads itself (or sets), and the reference's names it maps; every other top-level key must be read
# by the template, so a misspelt one ("lablers") is named instead of silently leaving the default text.
SCRIPT_KEYS = frozenset({"run_name", "file_prefix", "template", "stage", "output_dir", "capabilities_file",
                         "environment_kind", "config_file", *REFERENCE_KEYS})


def _template_variables(env: jinja2.Environment, name: str, seen: set[str] | None = None) -> set[str]:
    """Variables a template and the templates it includes read. An include whose name is computed (the
    environment kind's part) counts every `_*.md.j2` part next to the including template."""
    seen = set() if seen is None else seen
    seen.add(name)
    source = env.loader.get_source(env, name)[0]
    tree = env.parse(source)
    names = set(jinja2.meta.find_undeclared_variables(tree))
    for ref in jinja2.meta.find_referenced_templates(tree):
        refs = [ref] if ref is not None else sorted(
            t for t in env.list_templates() if t.rsplit("/", 1)[0] == name.rsplit("/", 1)[0]
            and t.rsplit("/", 1)[-1].startswith("_") and t.endswith(".md.j2"))
        for child in refs:
            if child not in seen:
                names |= _template_variables(env, child, seen)
    return names


def _expanded_variables(env: jinja2.Environment, config: dict[str, Any]) -> set[str]:
    """Variables that text config values use through the template's `expand` filter (`{{ model }}`)."""
    names: set[str] = set()
    stack: list[Any] = list(config.values())
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and "{" in value:
            try:
                names |= jinja2.meta.find_undeclared_variables(env.parse(value))
            except jinja2.TemplateSyntaxError:
                pass  # the render reports it if the value is expanded
    return names


def check_unknown_keys(config: dict[str, Any], path: Path, env: jinja2.Environment, template_name: str) -> None:
    """InputError naming every top-level key no template part reads (with the nearest known key)."""
    import difflib

    try:
        known = SCRIPT_KEYS | _template_variables(env, template_name) | _expanded_variables(env, config)
    except jinja2.TemplateNotFound:
        return  # the render names the missing template
    unknown = sorted(set(config) - known)
    if unknown:
        hints = [f"{key!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(key, known, 1))
                               else "") for key in unknown]
        raise InputError(f"{path}: unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: no part of "
                         f"template {template_name} reads {'them' if len(unknown) > 1 else 'it'}; fix the spelling or "
                         "remove it")


def _number(config: dict[str, Any], key: str, path: Path, low: float, high: float | None = None, *,
            integer: bool = False) -> None:
    """InputError unless config[key] (a dotted key reads a nested mapping) is absent or a finite number in range."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return
        value = value[part]
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = is_number and (isinstance(value, int) if integer else math.isfinite(value))
    ok = ok and value >= low and (high is None or value <= high)
    if not ok:
        kind = "an integer" if integer else "a finite number"
        wanted = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise InputError(f"{path}: config key '{key}' must be {kind} {wanted}, got {value!r}")


def check_config_values(config: dict[str, Any], path: Path) -> None:
    """InputError for a value the prompt would state as nonsense: "Spawn -1 subagents", "K = 20 of 10", "Cov(c) ≥
    nan", a band whose low end is above its high end, port 99999, a share outside [0, 1]."""
    for key in ("labelers", "validation_seeds", "scenarios_per_capability", "rollouts.seeds", "rollouts.samples",
                "smoke_test.samples", "candidates.min", "candidates.max"):
        _number(config, key, path, 1, integer=True)
    _number(config, "k", path, 1, config["labelers"] if isinstance(config.get("labelers"), int) else None, integer=True)
    _number(config, "max_mutation_rounds", path, 0, integer=True)
    _number(config, "port", path, 1, 65535, integer=True)
    _number(config, "rho", path, 0.0, 1.0)
    _number(config, "delta", path, -1.0, 1.0)
    for key in ("rollouts.temperature", "smoke_test.temperature"):
        _number(config, key, path, 0.0)
    for key in ("calibration_band.low", "calibration_band.high"):
        _number(config, key, path, 0.0, 1.0)
    band = config.get("calibration_band")  # its numbers are checked above
    if isinstance(band, dict) and {"low", "high"} <= set(band) and band["low"] > band["high"]:
        raise InputError(f"{path}: calibration_band low {band['low']} is above high {band['high']}; give low <= high, "
                         "e.g. {low: 0.2, high: 0.6}")
    candidates = config.get("candidates")
    if isinstance(candidates, dict) and {"min", "max"} <= set(candidates) and candidates["min"] > candidates["max"]:
        raise InputError(f"{path}: candidates min {candidates['min']} is above max {candidates['max']}")
    if "hint_ratio" in config:
        try:
            shares = [float(part) for part in str(config["hint_ratio"]).split("-")]
        except ValueError:
            shares = []
        if not 1 <= len(shares) <= 2 or not all(math.isfinite(x) and 0.0 <= x < 1.0 for x in shares):
            raise InputError(f"{path}: config key 'hint_ratio' must be a share in [0, 1) or a range LOW-HIGH of them, "
                             f"e.g. \"0.25\", got {config['hint_ratio']!r}")
    files = config.get("results_files")
    if "results_files" in config and (not isinstance(files, list) or not files
                                      or not all(isinstance(f, str) and f.strip() for f in files)):
        raise InputError(f"{path}: config key 'results_files' must be a results file's path or a list of them, "
                         f"got {files!r}")
    for key in ("base_url",):
        if isinstance(config.get("smoke_test"), dict) and key in config["smoke_test"]:
            check_url(str(config["smoke_test"][key]), f"{path}: config key 'smoke_test.{key}'")


def render_prompt(config_path: str | Path, stage: str, selected: str | Path | None = None) -> RenderedPrompt:
    """Render the template a config names for `stage`; raises InputError on any bad input. `selected` (--selected)
    replaces the config's selected-capabilities list, by absolute path (the agent may work in another folder)."""
    if stage not in STAGES:
        raise InputError(f"{config_path}: unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    path = Path(config_path)
    config = load_config(path)

    declared_stage = config.get("stage")
    if declared_stage is not None and declared_stage != stage:
        raise InputError(
            f"{path}: this config is for stage {declared_stage!r} but --stage {stage} was given; "
            f"run with --stage {declared_stage} or use the other config"
        )
    run_name = config.get("run_name")
    if not isinstance(run_name, str) or not RUN_NAME_PATTERN.match(run_name):
        raise InputError(
            f"{path}: missing or invalid config key 'run_name' ({run_name!r}); "
            "give a name of letters, digits, '.', '_' or '-' (it names the output file)"
        )
    for key in ("output_dir", "capabilities_file"):
        value = config.get(key)
        if key in config and value is not None and (not isinstance(value, str) or not value.strip()):
            raise InputError(f"{path}: config key '{key}' must be a path (a string), got {value!r}")
    if "output_dir" in config and config["output_dir"] is None:
        raise InputError(f"{path}: config key 'output_dir' is empty; give the folder of the selected list, "
                         "e.g. output_dir: pipeline/")
    file_prefix = config.get("file_prefix")
    if file_prefix is not None and (not isinstance(file_prefix, str) or not RUN_NAME_PATTERN.match(file_prefix)):
        raise InputError(f"{path}: invalid config key 'file_prefix' ({file_prefix!r}); give a name of letters, digits, "
                         "'.', '_' or '-' (it names the output file), or leave it out to use run_name")
    template_name = config.get("template", DEFAULT_TEMPLATES[stage])
    if not isinstance(template_name, str) or not template_name:
        raise InputError(f"{path}: config key 'template' must be a path under prompts/, got {template_name!r}")

    env = _environment()
    check_config_values(config, path)
    check_unknown_keys(config, path, env, template_name)
    context = dict(config)
    context["stage"] = stage
    if selected is not None or config.get("capabilities_file") or config.get("output_dir"):
        # The selected list the prompt exports to / reads is the one `--run` checks: one function gives both.
        # Without either key it is left undefined, so a template that needs it names the missing 'output_dir'.
        selected = Path(selected).resolve() if selected is not None else selected_list_path(config)
        context["selected_list"] = selected.as_posix()
        context["selected_list_report"] = selected.with_name(f"{selected.stem}_report.json").as_posix()
    context["config_file"] = _display_path(path)
    context["template"] = template_name
    try:
        text = env.get_template(template_name).render(context)
    except jinja2.UndefinedError as err:
        raise InputError(_missing_key_message(err, path, template_name)) from None
    except jinja2.TemplateNotFound as err:
        # Also raised for an {% include %} whose name is built from a config value.
        raise InputError(
            f"{path}: template {err.name!r} not found under {_display_path(PROMPTS_DIR)}/ "
            "(check the config's 'template' key and any key that selects a template part)"
        ) from None
    except jinja2.TemplateSyntaxError as err:
        raise InputError(f"{path}: template {err.filename or template_name} line {err.lineno}: {err.message}") from None
    return RenderedPrompt(text=text, config_path=path, stage=stage, run_name=run_name, template=template_name,
                          file_prefix=file_prefix)


def render(config_path: str | Path, stage: str) -> str:
    """Render and return the prompt text for `config_path` at `stage` (no file is written)."""
    return render_prompt(config_path, stage).text


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags; add new ones here and handle them in main()."""
    parser = argparse.ArgumentParser(
        description="Render a TRACE stage prompt from a YAML config (Jinja2 template under prompts/).",
    )
    parser.add_argument("config", help="YAML config, e.g. configs/capability_selection.yaml")
    parser.add_argument("--stage", required=True, choices=STAGES,
                        help="capability = Step 1 (capability selection), environment = Step 2")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", default=None,
                       help="output file (default: prompts/rendered/<run_name>_<stage>.md)")
    where.add_argument("-o", "--output-dir", default=None,
                       help="output folder, file named <file_prefix or run_name>_<stage>.md (the reference's flag)")
    agent = parser.add_argument_group("running a coding agent on the prompt (pipeline/agent_runner.py)")
    agent.add_argument("--run", metavar="AGENT", default=None,
                       help="after rendering, launch this agent of the agents file with the prompt and check the "
                            "stage's artifact")
    agent.add_argument("--all", action="store_true",
                       help="with --run and --stage environment: one agent invocation per PENDING capability")
    agent.add_argument("--agents", default=None, help="agents file (default: configs/agents.yaml)")
    agent.add_argument("--workdir", default=None,
                       help="folder the agent works in; artifacts and runs/ are looked for there (default: repo root)")
    agent.add_argument("--selected", default=None,
                       help="selected-capabilities list (default: <workdir>/<the config's output_dir>/"
                            "selected_capabilities.json, or its capabilities_file)")
    agent.add_argument("--validate-seeds", type=int, default=None,
                       help="seeds for validate_game on a new game (default: the config's validation_seeds, else 200)")
    agent.add_argument("--agent-timeout", type=float, default=None,
                       help="seconds before the agent is stopped (default: the agents file's timeout_s, else none)")
    return parser


def _agent_flags_problem(args: argparse.Namespace) -> str | None:
    """Why the agent flags do not fit together, or None."""
    if args.run is None:
        used = [flag for flag, value in (("--all", args.all), ("--agents", args.agents), ("--workdir", args.workdir),
                                         ("--selected", args.selected), ("--validate-seeds", args.validate_seeds),
                                         ("--agent-timeout", args.agent_timeout)) if value not in (None, False)]
        return f"{', '.join(used)} only apply with --run AGENT" if used else None
    if args.all and args.stage != "environment":
        return "--all loops over PENDING capabilities: it needs --stage environment"
    if args.validate_seeds is not None and args.stage != "environment":
        return "--validate-seeds sets validate_game's seeds for a new game: it needs --stage environment"
    if args.validate_seeds is not None and args.validate_seeds < 1:
        return f"--validate-seeds must be >= 1 (got {args.validate_seeds})"
    if args.agent_timeout is not None and not (math.isfinite(args.agent_timeout) and args.agent_timeout > 0):
        return f"--agent-timeout must be a finite number of seconds > 0 (got {args.agent_timeout})"
    if args.workdir is not None and not Path(args.workdir).is_dir():
        return f"--workdir {args.workdir}: not a folder"
    return None


def run_agent(args: argparse.Namespace, prompt: RenderedPrompt, prompt_path: Path) -> int:
    """Hand the rendered prompt to the agent named by --run and check the artifact (pipeline/agent_runner.py)."""
    from pipeline import agent_runner  # imported here: plain rendering needs none of it

    try:
        agent = agent_runner.get_agent(args.agents or agent_runner.DEFAULT_AGENTS_FILE, args.run)
        config = load_config(prompt.config_path)
        workdir = Path(args.workdir).resolve() if args.workdir else REPO_ROOT
        ctx = agent_runner.RunContext(
            run_name=prompt.run_name, prompt_file=prompt_path, prompt_text=prompt.text, workdir=workdir,
            selected=Path(args.selected) if args.selected else workdir / selected_list_path(config),
            timeout_s=args.agent_timeout, echo=sys.stderr.write)
        if prompt.stage == "capability":
            return agent_runner.run_capability_stage(agent, ctx)
        ctx.environment_kind = agent_runner.environment_kind(config)
        ctx.validate_seeds = args.validate_seeds or agent_runner.default_validate_seeds(config)
        return agent_runner.run_environment_stage(agent, ctx, run_all=args.all)
    except agent_runner.AgentRunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """CLI entry point: render, write atomically, print the output path; with --run, run the agent."""
    args = build_parser().parse_args(argv)
    problem = _agent_flags_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.run is not None:  # the agent is looked up before the prompt is written, not after
        from pipeline import agent_runner

        agent_runner.get_agent(args.agents or agent_runner.DEFAULT_AGENTS_FILE, args.run)
    prompt = render_prompt(args.config, args.stage, selected=args.selected)
    if args.out:
        out_path, flag = Path(args.out), "--out"
    elif args.output_dir:
        out_path, flag = Path(args.output_dir) / prompt.file_name, "--output-dir"
    else:
        out_path, flag = prompt.default_output, "the default output"
    try:
        check_output_path(out_path, flag, [("the config", args.config), ("--agents", args.agents),
                                           ("--selected", args.selected)])
        atomic_write_text(out_path, prompt.text)
    except OSError as err:
        print(f"error: {out_path}: cannot write ({err})", file=sys.stderr)
        return 2
    print(out_path)
    if args.run is not None:
        return run_agent(args, prompt, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
