"""Render a TRACE stage prompt (Step 1 or Step 2) from a YAML config.

    python render_pipeline.py configs/capability_selection.yaml --stage capability
    python render_pipeline.py configs/environment_generation.yaml --stage environment [--out PATH]
    python render_pipeline.py CONFIG --stage capability|environment --run AGENT [--all]

`--run AGENT` then hands the rendered prompt to the coding agent named AGENT in configs/agents.yaml
(`--agents FILE`), logs its output under runs/<run_name>/agent_logs/ and checks the stage's artifact;
`--all` (environment) repeats it for every PENDING capability. See pipeline/agent_runner.py.

The config is a YAML mapping. Every key becomes a template variable; two keys are read by this
script itself:
  run_name  names the default output, prompts/rendered/<run_name>_<stage>.md (required)
  template  template path under prompts/ (optional; per-stage default in DEFAULT_TEMPLATES)
  stage     optional guard: when present it must equal --stage
Templates are rendered with StrictUndefined, so a key the template needs but the config lacks is
an error that names the key instead of an empty hole in the prompt. Rendering happens fully in
memory before the atomic write, so a failed render leaves no file behind.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import jinja2

from pipeline._io import InputError, atomic_write_text, load_yaml_mapping

REPO_ROOT = Path(__file__).resolve().parent
PROMPTS_DIR = REPO_ROOT / "prompts"
RENDERED_DIR = PROMPTS_DIR / "rendered"
STAGES = ("capability", "environment")
DEFAULT_TEMPLATES = {
    "capability": "general/capability_selection.md.j2",
    "environment": "general/environment_generation.md.j2",
}
# run_name becomes part of a file name: keep it to characters that are safe everywhere.
RUN_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
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

    @property
    def default_output(self) -> Path:
        """prompts/rendered/<run_name>_<stage>.md under the repository root."""
        return RENDERED_DIR / f"{self.run_name}_{self.stage}.md"


def load_config(config_path: str | Path) -> dict[str, Any]:
    """Read a YAML config file and return its top-level mapping; problems raise InputError."""
    return load_yaml_mapping(config_path)


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


def _environment() -> jinja2.Environment:
    """Jinja environment rooted at prompts/: strict, trailing newline kept, tidy blocks."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PROMPTS_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        # Block tags on their own line leave no blank line or indentation behind.
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_prompt(config_path: str | Path, stage: str) -> RenderedPrompt:
    """Render the template a config names for `stage`; raises InputError on any bad input."""
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
    template_name = config.get("template", DEFAULT_TEMPLATES[stage])
    if not isinstance(template_name, str) or not template_name:
        raise InputError(f"{path}: config key 'template' must be a path under prompts/, got {template_name!r}")

    context = dict(config)
    context["stage"] = stage
    context["config_file"] = _display_path(path)
    context["template"] = template_name
    env = _environment()
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
    return RenderedPrompt(text=text, config_path=path, stage=stage, run_name=run_name, template=template_name)


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
    parser.add_argument("--out", default=None,
                        help="output file (default: prompts/rendered/<run_name>_<stage>.md)")
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
                       help="selected-capabilities list (default: <workdir>/pipeline/selected_capabilities.json)")
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
    if args.validate_seeds is not None and args.validate_seeds < 1:
        return f"--validate-seeds must be >= 1 (got {args.validate_seeds})"
    if args.agent_timeout is not None and args.agent_timeout <= 0:
        return f"--agent-timeout must be > 0 seconds (got {args.agent_timeout})"
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
            selected=Path(args.selected) if args.selected else workdir / agent_runner.SELECTED_RELATIVE,
            timeout_s=args.agent_timeout, echo=sys.stderr.write)
        if prompt.stage == "capability":
            return agent_runner.run_capability_stage(agent, ctx)
        ctx.environment_kind = agent_runner.environment_kind(config)
        ctx.validate_seeds = args.validate_seeds or agent_runner.default_validate_seeds(config)
        return agent_runner.run_environment_stage(agent, ctx, run_all=args.all)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except agent_runner.AgentRunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: render, write atomically, print the output path; with --run, run the agent."""
    args = build_parser().parse_args(argv)
    problem = _agent_flags_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        prompt = render_prompt(args.config, args.stage)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out_path = Path(args.out) if args.out else prompt.default_output
    if out_path.is_dir():
        print(f"error: {out_path}: is a folder; give --out a file path", file=sys.stderr)
        return 2
    try:
        atomic_write_text(out_path, prompt.text)
    except OSError as err:
        print(f"error: {out_path}: cannot write ({err})", file=sys.stderr)
        return 2
    print(out_path)
    if args.run is not None:
        return run_agent(args, prompt, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
