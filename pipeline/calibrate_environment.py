"""Is a game calibrated? Metrics and bands over the base model's rollouts on it.

Usage:
    python pipeline/calibrate_environment.py ROLLOUTS.json [--json-output FILE] [--success-threshold 1.0]
        [--min-mean-reward 0.2] [--max-mean-reward 0.6] [--min-success-rate 0.2] [--max-success-rate 0.6]
        [--min-reward-std 0.05] [--max-frac-all-success 0.2] [--max-frac-all-zero 0.2]
        [--max-frac-constant 0.5] [--min-frac-informative 0.5] [--min-pass-at-k 1=0.1] [--max-pass-at-k 8=0.9]
        [--pass-at-k 1,4,8,16] [--group-size 16 [--allow-partial-groups]]

The reference implementation's flag names work too: --mean-min/--mean-max, --success-min/--success-max,
--std-min, --max-all-success-groups, --max-all-zero-groups, --max-constant-groups, --min-informative-groups
(the same bands), --min-pass-at-k/--max-pass-at-k as comma lists (`1=0.1,4=0.3`, or `1:0.1`), --pass-at-k
(which k to report) and --group-size N: the samples each task should have; a group with fewer is a failed
band (collect with --samples N), a warning with --allow-partial-groups.

--max-frac-constant and --min-frac-informative are one limit seen from two sides (a group is informative
when it is not constant): give either one and the other follows; both only when they agree (exit 2 otherwise).

ROLLOUTS.json is τ²-bench results JSON whose simulations carry `task_id` (the seed), `sample_idx` (or
`trial`) and `reward_info.reward`; the samples sharing a task_id form a group (GRPO learns only from groups
whose rewards differ, hence the constant/informative shares).

Exit codes: 0 every band holds, 1 some band fails (each listed), 2 bad input: a flag (NaN included), an
unwritable --json-output or a bad rollouts file (checked before anything is computed; nothing written).
`--json-output` writes {"metrics", "errors", "warnings"}; errors are the failed bands.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_output_path, load_json
from common.validation import InputError, check_number

PASS_AT_K = (1, 4, 8, 16)
# Band attribute -> the reference implementation's flag for it (accepted as an alias).
REFERENCE_FLAGS = {
    "min_mean_reward": "--mean-min", "max_mean_reward": "--mean-max",
    "min_success_rate": "--success-min", "max_success_rate": "--success-max",
    "min_reward_std": "--std-min", "max_frac_all_success": "--max-all-success-groups",
    "max_frac_all_zero": "--max-all-zero-groups", "max_frac_constant": "--max-constant-groups",
    "min_frac_informative": "--min-informative-groups",
}
CONSTANT_TOLERANCE = 1e-12  # rewards closer than this count as equal
DEFAULT_MAX_FRAC_CONSTANT = 0.5  # also the default --min-frac-informative (1 - 0.5)
PAIRED_BANDS = ("max_frac_constant", "min_frac_informative")  # one limit: frac_informative = 1 - frac_constant


@dataclass(frozen=True)
class Sample:
    task_id: str
    sample_idx: int
    reward: float


def parse_simulations(simulations: Any, source: str = "rollouts") -> list[Sample]:
    """Validate simulations and return one Sample each; raises InputError naming the problem.

    A sample's index is `sample_idx`, or `trial` when there is no sample_idx. task_ids are compared as
    strings (τ²-bench writes them as strings; our games write the integer seed).
    """
    if not isinstance(simulations, list):
        raise InputError(f"{source}: `simulations` must be a list, got {type(simulations).__name__}")
    if not simulations:
        raise InputError(f"{source}: no simulations")
    samples: list[Sample] = []
    seen: set[tuple[str, int]] = set()
    for position, sim in enumerate(simulations):
        where = f"{source}: simulation {position}"
        if not isinstance(sim, dict):
            raise InputError(f"{where} is a {type(sim).__name__}, not an object")
        task_id = sim.get("task_id")
        if isinstance(task_id, bool) or not isinstance(task_id, (str, int)) or task_id == "":
            raise InputError(f"{where} has no task_id (got {task_id!r})")
        index = sim.get("sample_idx", sim.get("trial"))
        if isinstance(index, bool) or not isinstance(index, int):
            raise InputError(f"{where} (task_id {task_id!r}) needs an integer sample_idx or trial, got {index!r}")
        reward_info = sim.get("reward_info")
        reward = reward_info.get("reward") if isinstance(reward_info, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise InputError(f"{where} (task_id {task_id!r}) has no numeric reward_info.reward (got {reward!r})")
        if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise InputError(f"{where} (task_id {task_id!r}) has reward {reward!r} outside [0, 1]")
        key = (str(task_id), index)
        if key in seen:
            raise InputError(f"{where}: duplicate (task_id, sample_idx) = ({task_id!r}, {index})")
        seen.add(key)
        samples.append(Sample(str(task_id), index, float(reward)))
    return samples


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one group: 1 - C(n-c, k) / C(n, k), as a product (no huge binomials)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, the group has {n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=0}^{k-1} (n-c-i) / (n-i)
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def compute_metrics(
    simulations: Any, success_threshold: float = 1.0, ks: tuple[int, ...] = PASS_AT_K, source: str = "rollouts"
) -> dict[str, Any]:
    """Calibration metrics of τ²-bench simulations (see the module docstring); raises InputError on bad input.

    pass@k maps are keyed by k as a string and hold only the k <= the smallest group's size. `source`
    names the input in error messages.
    """
    samples = parse_simulations(simulations, source)
    groups: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[sample.task_id].append(sample)
    rewards = [s.reward for s in samples]
    n = len(rewards)
    mean = sum(rewards) / n
    sizes = [len(g) for g in groups.values()]
    smallest = min(sizes)

    def success(reward: float) -> bool:
        return reward >= success_threshold

    all_success = all_zero = constant = 0
    for group in groups.values():
        values = [s.reward for s in group]
        all_success += all(success(v) for v in values)
        all_zero += all(v == 0.0 for v in values)
        constant += max(values) - min(values) <= CONSTANT_TOLERANCE
    n_groups = len(groups)
    unbiased: dict[str, float] = {}
    first: dict[str, float] = {}
    for k in sorted(set(ks)):
        if k > smallest:
            continue
        unbiased[str(k)] = sum(
            pass_at_k(len(g), sum(success(s.reward) for s in g), k) for g in groups.values()
        ) / n_groups
        first[str(k)] = sum(
            any(success(s.reward) for s in sorted(g, key=lambda s: s.sample_idx)[:k]) for g in groups.values()
        ) / n_groups
    return {
        "mean_reward": mean,
        "success_rate": sum(success(r) for r in rewards) / n,
        "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
        "n_groups": n_groups,
        "n_samples": n,
        "frac_all_success": all_success / n_groups,
        "frac_all_zero": all_zero / n_groups,
        "frac_constant": constant / n_groups,
        "frac_informative": 1.0 - constant / n_groups,
        "pass_at_k": unbiased,
        "pass_at_k_first": first,
        "min_group_size": smallest,
        "max_group_size": max(sizes),
        "n_groups_size_1": sizes.count(1),
        "success_threshold": success_threshold,
    }


SPREAD_DECIMALS = 9  # rewards equal to this many decimals are one value (GRPO drops groups within 1e-8)


def _value_shares(rewards: list[float]) -> dict[float, float]:
    """{reward value: share of `rewards` equal to it} (values compared to SPREAD_DECIMALS decimals)."""
    counts = Counter(round(r, SPREAD_DECIMALS) for r in rewards)
    return {value: count / len(rewards) for value, count in counts.items()}


def _pair_agreement(rewards: list[float]) -> float:
    """Share of the ordered pairs of distinct samples of one task whose rewards are equal (needs >= 2 samples)."""
    n = len(rewards)
    counts = Counter(round(r, SPREAD_DECIMALS) for r in rewards)
    return sum(c * (c - 1) for c in counts.values()) / (n * (n - 1))


def _constant_group_chance(shares: dict[float, float], concentration: float | None, group_size: int) -> float:
    """P(a group of `group_size` episodes of one task all score the same), tasks' value probabilities drawn
    from Dirichlet(concentration * shares): sum over values v of E[θ_v^G] = prod_i (α π_v + i) / (α + i).
    concentration None: α infinite, every task plays the pooled shares (sum of π_v^G); 0: every task always
    scores one value (1)."""
    if concentration is None:
        return sum(share ** group_size for share in shares.values())
    if concentration == 0.0:
        return 1.0
    return sum(math.prod((concentration * share + i) / (concentration + i) for i in range(group_size))
               for share in shares.values())


def estimate_reward_spread(simulations: Any, group_size: int, source: str = "rollouts") -> dict[str, Any]:
    """Estimated share of GRPO groups of `group_size` episodes of one task whose rewards are not all equal.

    GRPO learns only from a group whose rewards differ (a partial reward counts as much as a success), but
    calibration plays fewer samples per task (n) than a GRPO group holds (G): a task's own n rewards cannot
    say how often G draws would all agree, and the plug-in guesses are biased. Per task they are biased low
    (two samples of a task that succeeds 30% of the time agree 58% of the time, and then the task looks
    constant, while 94% of its groups of 8 vary); pooled over tasks they are biased high (tasks that each
    always pass or always fail pool into a 50/50 mix whose groups would nearly all vary, yet none does).

    So the tasks' reward distributions are modelled as draws from a Dirichlet over the reward values seen,
    centred on their task-averaged shares π (the Dirichlet-multinomial model of overdispersed counts), and
    its concentration α is fitted by the method of moments to what n >= 2 samples do measure without bias:
    the chance A that two samples of the same task score alike (averaged over tasks), which the model puts
    at (α S + 1) / (α + 1) with S = Σ π_v², so α = (1 - A) / (A - S). Then a group of G is constant with
    chance Σ_v Π_{i<G} (α π_v + i) / (α + i), and the estimate is one minus that. A <= S (tasks agree no
    more than the pooled rewards do): α is infinite, every task plays the pooled shares, constant chance
    Σ π_v^G. A = 1 (every task's samples agree): α = 0, no group varies. At G = 2 the estimate is 1 - A
    itself. With no task of two samples A is unmeasured and the pooled shares are used (an upper bound).

    Returns {"spread_share", "group_size", "pair_agreement" (A, None when unmeasured), "concentration"
    (α; None when infinite)}. Raises InputError on bad simulations, ValueError on group_size < 1.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1 (GRPO's samples per task), got {group_size!r}")
    groups: dict[str, list[float]] = defaultdict(list)
    for sample in parse_simulations(simulations, source):
        groups[sample.task_id].append(sample.reward)
    per_task = [_value_shares(rewards) for rewards in groups.values()]
    shares: dict[float, float] = defaultdict(float)
    for task_shares in per_task:
        for value, share in task_shares.items():
            shares[value] += share / len(per_task)
    paired = [_pair_agreement(rewards) for rewards in groups.values() if len(rewards) >= 2]
    agreement = sum(paired) / len(paired) if paired else None
    pooled_agreement = sum(share ** 2 for share in shares.values())
    if agreement is None or agreement <= pooled_agreement:
        concentration = None
    elif agreement >= 1.0:
        concentration = 0.0
    else:
        concentration = (1.0 - agreement) / (agreement - pooled_agreement)
    constant = _constant_group_chance(shares, concentration, group_size)
    return {"spread_share": min(1.0, max(0.0, 1.0 - constant)), "group_size": group_size,
            "pair_agreement": agreement, "concentration": concentration}


@dataclass
class Bands:
    """Where a calibrated game's metrics must lie (defaults: the base model succeeds 20-60% of the time)."""

    min_mean_reward: float = 0.2
    max_mean_reward: float = 0.6
    min_success_rate: float = 0.2
    max_success_rate: float = 0.6
    min_reward_std: float = 0.05
    max_frac_all_success: float = 0.2
    max_frac_all_zero: float = 0.2
    # One limit seen from two sides (frac_informative = 1 - frac_constant): give either, the other follows
    # (None); both default to 0.5, and a pair that disagrees is refused (`_pair_constant_informative`).
    max_frac_constant: float | None = None
    min_frac_informative: float | None = None
    min_pass_at_k: dict[int, float] = field(default_factory=dict)  # k -> lowest allowed unbiased pass@k
    max_pass_at_k: dict[int, float] = field(default_factory=dict)  # k -> highest allowed unbiased pass@k

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is None and name in PAIRED_BANDS:
                continue  # follows from the other one of the pair, below
            if name.endswith("pass_at_k"):
                for k, bound in value.items():
                    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                        raise InputError(f"{name}: k must be a positive int, got {k!r} (write K=VALUE, e.g. 4=0.5)")
                    if not 0.0 <= bound <= 1.0:
                        raise InputError(f"{name}: bound for k={k} must be in [0, 1], got {bound}")
            elif not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be a number in [0, 1], got {value!r}")
        for low, high in (("min_mean_reward", "max_mean_reward"), ("min_success_rate", "max_success_rate")):
            if getattr(self, low) > getattr(self, high):
                raise InputError(f"{low} ({getattr(self, low)}) is above {high} ({getattr(self, high)}); swap them")
        self._pair_constant_informative()

    def _pair_constant_informative(self) -> None:
        """Fill in whichever of max_frac_constant / min_frac_informative is None from the other: set alone, either
        would be overruled by the other's default. InputError when both are set and disagree."""
        constant, informative = self.max_frac_constant, self.min_frac_informative
        if constant is None and informative is None:
            constant, informative = DEFAULT_MAX_FRAC_CONSTANT, 1.0 - DEFAULT_MAX_FRAC_CONSTANT
        elif informative is None:
            informative = 1.0 - constant
        elif constant is None:
            constant = 1.0 - informative
        elif abs(constant + informative - 1.0) > 1e-9:
            raise InputError(f"max_frac_constant ({constant}) and min_frac_informative ({informative}) disagree: "
                             "informative groups are the non-constant ones, so one is 1 - the other; give only one "
                             "of --max-frac-constant and --min-frac-informative")
        self.max_frac_constant, self.min_frac_informative = constant, informative


# (metric, bound attribute, "min" or "max", flag)
_SCALAR_BANDS = (
    ("mean_reward", "min_mean_reward", "min"),
    ("mean_reward", "max_mean_reward", "max"),
    ("success_rate", "min_success_rate", "min"),
    ("success_rate", "max_success_rate", "max"),
    ("reward_std", "min_reward_std", "min"),
    ("frac_all_success", "max_frac_all_success", "max"),
    ("frac_all_zero", "max_frac_all_zero", "max"),
    ("frac_constant", "max_frac_constant", "max"),
    ("frac_informative", "min_frac_informative", "min"),
)


def _flag(attribute: str) -> str:
    return "--" + attribute.replace("_", "-")


def check_bands(metrics: dict[str, Any], bands: Bands) -> tuple[list[str], list[str]]:
    """(errors, warnings): one error per band the metrics miss; warnings about the group shapes.

    Raises InputError when a pass@k band asks for k larger than the smallest group.
    """
    errors: list[str] = []
    for metric, attribute, side in _SCALAR_BANDS:
        value, bound = metrics[metric], getattr(bands, attribute)
        if (side == "min" and value < bound) or (side == "max" and value > bound):
            word = "below the minimum" if side == "min" else "above the maximum"
            # rounded for display only: a bound derived as 1 - 0.7 reads 0.3, not 0.30000000000000004
            errors.append(f"{metric} = {value:.4f} is {word} {round(bound, 12)} ({_flag(attribute)})")
    for attribute, side in (("min_pass_at_k", "min"), ("max_pass_at_k", "max")):
        for k, bound in sorted(getattr(bands, attribute).items()):
            value = metrics["pass_at_k"].get(str(k))
            if value is None:
                if k > metrics["min_group_size"]:
                    raise InputError(
                        f"k={k} needs groups of at least {k} samples; smallest group has {metrics['min_group_size']}"
                    )
                raise InputError(f"pass@{k} was not computed; pass ks=({k},) to compute_metrics")
            if (side == "min" and value < bound) or (side == "max" and value > bound):
                word = "below the minimum" if side == "min" else "above the maximum"
                errors.append(f"pass@{k} = {value:.4f} is {word} {bound} ({_flag(attribute)} {k}={bound})")
    warnings: list[str] = []
    if metrics["min_group_size"] != metrics["max_group_size"]:
        warnings.append(
            f"unequal group sizes ({metrics['min_group_size']} to {metrics['max_group_size']} samples per task_id); "
            "pass@k is limited by the smallest group"
        )
    if metrics["n_groups_size_1"]:
        warnings.append(
            f"{metrics['n_groups_size_1']} group(s) of size 1: a single sample per task tells nothing about "
            "within-group variance (GRPO needs several samples per task)"
        )
    return errors, warnings


def _k_bounds(text: str) -> list[tuple[int, float]]:
    """argparse type for K=VALUE, or a comma list of them (`1=0.1,4=0.3`; `K:VALUE` also works)."""
    bounds = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        k_text, sep, value_text = part.partition("=") if "=" in part else part.partition(":")
        try:
            if not sep:
                raise ValueError
            bounds.append((int(k_text), float(value_text)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected K=VALUE (e.g. 4=0.5) or a comma list of them, got {text!r}") \
                from None
    if not bounds:
        raise argparse.ArgumentTypeError(f"expected K=VALUE (e.g. 4=0.5), got {text!r}")
    return bounds


def _k_list(text: str) -> list[int]:
    """argparse type for --pass-at-k: a comma list of positive ints (`1,4,8,16`)."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of k >= 1 (e.g. 1,4,8,16), got {text!r}")
    return ks


def check_group_size(metrics: dict[str, Any], samples: list[int], group_size: int, allow_partial: bool,
                     errors: list[str], warnings: list[str]) -> None:
    """A group with fewer than `group_size` samples: an error (a warning when partial groups are allowed)."""
    short = sum(size < group_size for size in samples)
    if not short:
        return
    message = (f"{short} of {metrics['n_groups']} groups have fewer than --group-size {group_size} samples "
               f"(smallest: {metrics['min_group_size']}); collect --samples {group_size} per seed")
    (warnings if allow_partial else errors).append(message)


def format_summary(source: str, metrics: dict[str, Any], errors: list[str], warnings: list[str]) -> str:
    """Readable summary of the metrics and the band verdict."""
    lines = [
        f"calibration of {source}: {metrics['n_samples']} samples in {metrics['n_groups']} groups "
        f"(size {metrics['min_group_size']}-{metrics['max_group_size']})",
        f"  mean_reward {metrics['mean_reward']:.4f}   success_rate {metrics['success_rate']:.4f} "
        f"(reward >= {metrics['success_threshold']})   reward_std {metrics['reward_std']:.4f}",
        f"  groups: all-success {metrics['frac_all_success']:.3f}   all-zero {metrics['frac_all_zero']:.3f}   "
        f"constant {metrics['frac_constant']:.3f}   informative {metrics['frac_informative']:.3f}",
        "  pass@k (unbiased):      " + "   ".join(f"k={k} {v:.4f}" for k, v in metrics["pass_at_k"].items()),
        "  pass@k (first k by idx): " + "   ".join(f"k={k} {v:.4f}" for k, v in metrics["pass_at_k_first"].items()),
    ]
    lines += [f"WARN  {w}" for w in warnings]
    lines += [f"FAIL  {e}" for e in errors]
    lines.append("RESULT: " + ("PASS, every band holds" if not errors else f"FAIL, {len(errors)} band(s) missed"))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Calibration metrics and bands of a game's rollouts.")
    parser.add_argument("rollouts", help="τ²-bench results JSON with task_id, sample_idx (or trial), reward_info.reward")
    parser.add_argument("--json-output", help="write {metrics, errors, warnings} here")
    parser.add_argument("--success-threshold", type=float, default=1.0, help="success = reward >= this (default 1.0)")
    defaults = Bands()
    for _, attribute, _ in _SCALAR_BANDS:
        note = f"default {getattr(defaults, attribute)}"
        paired = attribute in PAIRED_BANDS  # None: Bands derives it from the other one of the pair
        if paired:
            note += ", or 1 - the other of " + " / ".join(map(_flag, PAIRED_BANDS)) + " when only that is given"
        parser.add_argument(_flag(attribute), REFERENCE_FLAGS[attribute], dest=attribute, type=float,
                            default=None if paired else getattr(defaults, attribute), help=note)
    parser.add_argument("--min-pass-at-k", type=_k_bounds, action="extend", default=[], metavar="K=VALUE[,K=VALUE]")
    parser.add_argument("--max-pass-at-k", type=_k_bounds, action="extend", default=[], metavar="K=VALUE[,K=VALUE]")
    parser.add_argument("--pass-at-k", type=_k_list, default=None, metavar="K[,K]",
                        help="k values to report pass@k for (default 1,4,8,16, those that fit the smallest group)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="samples every task should have; a smaller group fails the calibration")
    parser.add_argument("--allow-partial-groups", action="store_true",
                        help="with --group-size: smaller groups are a warning, not a failure")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Flags and the output path first: a typo must not cost a run.
    check_number(args.success_threshold, "--success-threshold", 0.0, 1.0, low_open=True)
    for _, attribute, _ in _SCALAR_BANDS:
        if getattr(args, attribute) is not None:  # None: a paired band left to Bands
            check_number(getattr(args, attribute), _flag(attribute), 0.0, 1.0)
    for flag, bounds in (("--min-pass-at-k", args.min_pass_at_k), ("--max-pass-at-k", args.max_pass_at_k)):
        for k, bound in bounds:
            check_number(bound, f"the VALUE of {flag} {k}=VALUE", 0.0, 1.0)
    if args.group_size is not None and args.group_size < 1:
        raise InputError(f"--group-size must be >= 1, got {args.group_size}")
    if args.allow_partial_groups and args.group_size is None:
        raise InputError("--allow-partial-groups only applies with --group-size N")
    if args.json_output is not None:
        check_output_path(args.json_output, "--json-output", [("the rollouts file", args.rollouts)])
    bands = Bands(
        **{attribute: getattr(args, attribute) for _, attribute, _ in _SCALAR_BANDS},
        min_pass_at_k=dict(args.min_pass_at_k),
        max_pass_at_k=dict(args.max_pass_at_k),
    )
    data = load_json(args.rollouts)
    if not isinstance(data, dict) or "simulations" not in data:
        raise InputError(f"{args.rollouts}: not τ²-bench results JSON (no `simulations` key)")
    ks = tuple(sorted({*(args.pass_at_k or PASS_AT_K), *bands.min_pass_at_k, *bands.max_pass_at_k}))
    metrics = compute_metrics(data["simulations"], args.success_threshold, ks, source=args.rollouts)
    errors, warnings = check_bands(metrics, bands)
    skipped = sorted(k for k in args.pass_at_k or () if str(k) not in metrics["pass_at_k"])
    if skipped:
        warnings.append(f"pass@{', pass@'.join(map(str, skipped))} not computed: the smallest group has "
                        f"{metrics['min_group_size']} samples")
    if args.group_size is not None:
        sizes = list(Counter(sample.task_id for sample in parse_simulations(data["simulations"],
                                                                             args.rollouts)).values())
        check_group_size(metrics, sizes, args.group_size, args.allow_partial_groups, errors, warnings)
    print(format_summary(args.rollouts, metrics, errors, warnings))
    if args.json_output:
        atomic_write_json(args.json_output, {"metrics": metrics, "errors": errors, "warnings": warnings})
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
