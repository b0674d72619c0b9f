"""The demo's base agent, shipped: the weights `make demo` starts from, so that every machine runs one experiment.

    python -m demo.base_agent ship [--run-dir runs/demo] [--to assets/demo_base_agent]
    python -m demo.base_agent check [--config configs/demo.yaml]
    python -m demo --rebuild-base        (build the base agent here instead of using the shipped one)

Why ship it: building the base agent (SFT of the tiny model on 10,000 demonstrations) is most of a first run's
time, and it is not reproducible across machines. Three builds on one machine gave bit-identical weights, but
a build on another 2-core machine (AMD EPYC, same torch) gave other weights that scored 0.213 instead of
0.307 greedy pass^1 (issue 29), so every downstream figure moved with the CPU. With the agent shipped, the demo
is the same experiment everywhere, and its first run skips the SFT.

The shipped folder holds the model folder's files (safetensors in float32, as the SFT saved them: the
evaluation figures are the build's own) and `manifest.json`:

  settings      the base step's settings it was built from: the config's `base` section and the storefront
                config the demonstrations were drawn from
  fingerprint   sha256 of `settings` (canonical JSON); the demo uses the shipped agent only when the fingerprint
                of its own settings is this one
  files         sha256 and size of every shipped file (`weights_sha256`: model.safetensors's)
  built         when, where (machine, torch, commit) and how long
  figures       the base step's figures (SFT steps, loss, ...; the loss curves stay in sft_info.json)
  rebuild       the command that builds it again

`tests/test_demo_base.py` fails when `configs/demo.yaml` (or the storefront config it names) no longer matches
the shipped manifest: then rebuild (`python -m demo --rebuild-base`) and ship the result
(`python -m demo.base_agent ship`).
"""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
import hashlib
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.cli import cli_entry, exit_code
from common.paths import REPO_ROOT
from common.io import atomic_write_json, load_json
from common.run_folder import check_output_dir
from common.validation import InputError

SHIPPED_DIR = REPO_ROOT / "assets" / "demo_base_agent"
MANIFEST = "manifest.json"
# The model folder's files as `Demo.base` saves them (sft_info.json holds the SFT's loss curves).
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "sft_info.json")
REBUILD_COMMAND = "python -m demo --rebuild-base   (then: python -m demo.base_agent ship)"


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of the base step's settings as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _differing_keys(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested settings dicts (for saying what no longer matches)."""
    out = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            out += _differing_keys(left, right, f"{prefix}{key}.")
        elif json.dumps(left, sort_keys=True, default=str) != json.dumps(right, sort_keys=True, default=str):
            out.append(prefix + key)
    return out


def shipped_status(settings: dict[str, Any], shipped_dir: Path = SHIPPED_DIR) -> tuple[dict[str, Any] | None, str]:
    """(manifest, "") when the shipped agent was built from exactly `settings` and its files are intact;
    (None, why not) otherwise."""
    manifest_path = shipped_dir / MANIFEST
    if not manifest_path.is_file():
        return None, f"no shipped base agent ({manifest_path} is missing)"
    manifest = load_json(manifest_path)
    if manifest.get("fingerprint") != settings_fingerprint(settings):
        changed = _differing_keys(manifest.get("settings", {}), settings)
        return None, (f"the shipped base agent was built from other settings ({', '.join(changed[:6]) or 'format'}"
                      f"{' …' if len(changed) > 6 else ''} differ)")
    for name, entry in manifest["files"].items():
        path = shipped_dir / name
        if not path.is_file():
            return None, f"the shipped base agent's {name} is missing"
        if path.stat().st_size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
            # e.g. a Git LFS pointer or a checkout that rewrote line endings
            return None, f"the shipped base agent's {name} does not match its manifest's sha256"
    return manifest, ""


def install_shipped(manifest: dict[str, Any], model_dir: Path, shipped_dir: Path = SHIPPED_DIR) -> dict[str, Any]:
    """Copy the shipped model into `model_dir`; returns the base step's figures, marked as shipped."""
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in manifest["files"]:
        shutil.copyfile(shipped_dir / name, model_dir / name)
    sft_info = load_json(model_dir / "sft_info.json")
    # the SFT stages' figures with their loss curves (the manifest's have none)
    stages = {stage: sft_info[stage] for stage in ("copy_drills", "selection", "refresh") if stage in sft_info}
    return {**manifest["figures"], "log": sft_info.get("log", []), "openings": sft_info.get("openings"), **stages,
            "shipped": {"weights_sha256": manifest["weights_sha256"], "built": manifest["built"],
                        "rebuild": manifest["rebuild"]}}


def _git_commit(folder: Path) -> str:
    """The commit of the checkout holding `folder` ("unknown" outside one)."""
    folder = folder if folder.is_dir() else folder.parent
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux: platform's answer is all there is
        pass
    return platform.processor() or platform.machine()


def build_environment(run_dir: Path) -> dict[str, Any]:
    """Where a base agent is being built: commit, CPU, python, torch, threads (recorded by the base step, since
    a build on another CPU gives other weights)."""
    import torch

    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "commit": _git_commit(run_dir),
            "machine": _cpu_name(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def ship(run_dir: Path, shipped_dir: Path = SHIPPED_DIR) -> dict[str, Any]:
    """Write the base agent of a completed base step in `run_dir` to `shipped_dir` with its manifest."""
    import torch

    record_path = run_dir / "base" / "step.json"
    if not record_path.is_file():
        raise InputError(f"{record_path} is missing: run the demo's base step first (python -m demo)")
    record = load_json(record_path)
    if not record.get("complete"):
        raise InputError(f"{record_path}: the base step did not complete; run the demo again to finish it")
    figures = record["figures"]
    if "shipped" in figures:
        raise InputError(f"{run_dir}'s base agent is the shipped one already; build one with --rebuild-base first")
    settings = {k: v for k, v in record["settings"].items() if k != "source"}
    model_dir = run_dir / "base" / "model"
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise InputError(f"{model_dir} lacks {missing}: not a base agent the demo saved")
    staging = shipped_dir.with_name(shipped_dir.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    files = {}
    for name in MODEL_FILES:
        shutil.copyfile(model_dir / name, staging / name)
        files[name] = {"sha256": file_sha256(staging / name), "bytes": (staging / name).stat().st_size}
    manifest = {
        "format": 1, "settings": settings, "fingerprint": settings_fingerprint(settings), "files": files,
        "weights_sha256": files["model.safetensors"]["sha256"],
        # Recorded by the build (runs from before that: the run folder's checkout, this machine, the marker's date)
        "built": {**(figures.get("built") or {
            "date": datetime.fromtimestamp(record_path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d"),
            "commit": _git_commit(run_dir), "machine": _cpu_name(), "python": platform.python_version(),
            "torch": torch.__version__}), "device": record.get("device", "cpu"), "seconds": record.get("seconds")},
        # The SFT stages' figures without their loss curves (those stay in sft_info.json)
        "figures": {k: {f: x for f, x in v.items() if f != "log"} if isinstance(v, dict) and "log" in v else v
                    for k, v in figures.items() if k not in ("log", "built")},
        "rebuild": REBUILD_COMMAND}
    atomic_write_json(staging / MANIFEST, manifest)
    if shipped_dir.exists():
        shutil.rmtree(shipped_dir)
    staging.rename(shipped_dir)
    return manifest


@cli_entry
def main(argv: list[str] | None = None) -> int:
    from demo.config import PROFILES, base_settings, load_demo_config

    parser = argparse.ArgumentParser(prog="python -m demo.base_agent", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ship_parser = sub.add_parser("ship", help="ship the base agent a demo run built (its runs/<name>/base)")
    ship_parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo")
    ship_parser.add_argument("--to", type=Path, default=SHIPPED_DIR, help=f"default {SHIPPED_DIR}")
    check_parser = sub.add_parser("check", help="does the shipped agent match a demo config? (exit 1 if not)")
    check_parser.add_argument("--config", type=Path, default=REPO_ROOT / PROFILES["default"])
    check_parser.add_argument("--shipped", type=Path, default=SHIPPED_DIR)
    args = parser.parse_args(argv)
    if args.command == "ship":
        check_output_dir(args.to, "--to", inputs=[("--run-dir", args.run_dir)])
        manifest = ship(args.run_dir, args.to)
        print(f"shipped {args.run_dir / 'base' / 'model'} -> {args.to} (weights sha256 "
              f"{manifest['weights_sha256'][:16]}…, settings fingerprint {manifest['fingerprint'][:16]}…)")
        return 0
    config = load_demo_config(args.config)
    manifest, why = shipped_status(base_settings(config, config.storefront_config(REPO_ROOT)), args.shipped)
    if manifest is None:
        print(f"{args.config}: {why}; rebuild it: {REBUILD_COMMAND}")
        return 1
    print(f"{args.config}: the shipped base agent matches (weights sha256 {manifest['weights_sha256'][:16]}…)")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
