"""Generate pytest-graded code-repair scenarios for one capability.

    python -m swebench.generate --capability NAME --n N --seed S --out FILE
        [--call-depth 3|4|5] [--n-decoys K]      (deep_call_graph_traversal)
        [--template KEY]                        (semantic_logic_precision)
        [--size small|large]                    (both; default large: 300-600 source lines)

Scenario i uses seed S+i and is the same on every run (the generators are seeded). FILE is a JSON list in
the scenarios format (swebench/scenario.py); the default place for a capability's set is
pipeline/swebench/<capability>/scenarios_parsed.json. Generation only builds and checks the scenarios
in this process (the generator's own code, never untrusted code); run `python -m swebench.selftest
FILE` to prove each one under pytest in the sandbox.

Exit codes: 0 written, 2 bad flags or an unwritable --out (checked before any work; nothing written).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from common.cli import cli_entry, exit_code, seed_value
from common.io import check_output_path
from swebench.generators import GENERATORS, generate_one
from swebench.generators.filler import SIZES
from swebench.generators.semantic_logic import TEMPLATES
from swebench.scenario import save_scenarios


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swebench.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--capability", required=True, choices=sorted(GENERATORS))
    parser.add_argument("--n", type=int, required=True, help="number of scenarios")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the first scenario (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="scenarios JSON file to write")
    parser.add_argument("--call-depth", type=int, choices=(3, 4, 5), default=None,
                        help="deep_call_graph_traversal: calls from the public entry to the buggy helper")
    parser.add_argument("--n-decoys", type=int, default=None, help="deep_call_graph_traversal: correct sibling helpers")
    parser.add_argument("--template", choices=[t.key for t in TEMPLATES], default=None,
                        help="semantic_logic_precision: use only this template")
    parser.add_argument("--size", choices=SIZES, default=None,
                        help="small: the bug's modules alone (about 30-100 lines); large (default): 300-600 lines of "
                             "source, with correct realistic code around the bug")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    options = {}
    if args.capability == "deep_call_graph_traversal":
        if args.template:
            parser.error("--template applies to semantic_logic_precision only")
        options = {k: v for k, v in (("call_depth", args.call_depth), ("n_decoys", args.n_decoys)) if v is not None}
        if args.n_decoys is not None and not 0 <= args.n_decoys <= 5:
            parser.error("--n-decoys must be within 0..5")
    else:
        if args.call_depth is not None or args.n_decoys is not None:
            parser.error("--call-depth / --n-decoys apply to deep_call_graph_traversal only")
        options = {"template": args.template} if args.template else {}
    if args.size is not None:
        options["size"] = args.size
    if args.n < 1:
        parser.error("--n must be >= 1")
    check_output_path(args.out, "--out")
    scenarios = [generate_one(args.capability, seed, **options) for seed in
                 tqdm(range(args.seed, args.seed + args.n), desc=f"generate {args.capability}", unit="scenario",
                      disable=args.no_progress or None, file=sys.stderr)]
    save_scenarios(args.out, scenarios)
    print(f"{len(scenarios)} {args.capability} scenarios (seeds {args.seed}..{args.seed + args.n - 1}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
