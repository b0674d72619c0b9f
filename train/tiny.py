"""Build a tiny random-init Qwen3 model and a byte-level BPE tokenizer locally (no hub, no network).

Tests, the CPU demo and GRPO smoke runs need a causal LM that loads with `AutoModelForCausalLM` /
`AutoTokenizer` from a local folder. This module trains a byte-level BPE tokenizer (`tokenizers`) on the
given text, or on a deterministic built-in corpus of English sentences and rendered tool-calling chats,
wraps it as a transformers fast tokenizer with the TRACE chat template, and saves a random-init
`Qwen3ForCausalLM` in fp32 safetensors.

    python -m train.tiny --out runs/tiny [--vocab 1024 --hidden 192 --layers 4 --heads 4 --ffn 576]
                         [--corpus notes.txt chats.jsonl ...] [--seed 0]

A `--corpus` file ending in `.jsonl` holds chat records `{"messages": [...], "tools": [...]}` (rendered with
the chat template first, so the tokenizer learns the real format); any other file is plain UTF-8 text.
The built-in corpus does not depend on `--seed`: the seed only changes the weight initialisation, so
models built with different seeds share one tokenizer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from jinja2.exceptions import TemplateError
from tqdm import tqdm

from common.cli import cli_entry, exit_code, seed_value
from common.io import atomic_write_json, check_output_folder, load_jsonl
from common.validation import InputError, check_int
from train.chat_template import (
    TOOLS_VIEWS,
    chat_template,
    ENDOFTEXT,
    IM_END,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    render_chat,
)
from train.tiny_corpus import builtin_corpus

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

# Written into every built folder; its presence is what allows a rebuild to replace the folder.
BUILD_INFO_FILE = "tiny_build.json"
BUILD_INFO_FORMAT = "trace-tiny-model/1"

BYTE_ALPHABET_SIZE = 256
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
# A "tiny" model's vocabulary: far above what a corpus of this size yields (a few thousand), well below sizes whose
# embedding alone would not fit in memory; --vocab 100000000 is a typo, not a request.
MAX_VOCAB_SIZE = 262_144

# Qwen2/3 pre-tokenizer split: letters keep one leading non-letter (so `"name` or ` the` is one piece),
# digits are split one by one (numbers and ids generalise), newlines group. Then bytes map to symbols.
PRETOKENIZE_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@dataclass
class TinyModelConfig:
    """Sizes of the tiny model. Defaults are the measured CPU-demo sizing."""

    vocab_size: int = 1024  # target: BPE stops earlier when the corpus has few distinct words
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: same as num_heads (plain multi-head attention)
    intermediate_size: int | None = None  # None: 3 * hidden_size
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise InputError(f"vocab_size={self.vocab_size:,} is above the maximum {MAX_VOCAB_SIZE:,} of a tiny model; "
                             "use e.g. --vocab 1024 (BPE stops earlier when the corpus has no more merges)")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise InputError(
                f"vocab_size={self.vocab_size} is below the minimum {MIN_VOCAB_SIZE} "
                f"({BYTE_ALPHABET_SIZE} byte symbols + {len(SPECIAL_TOKENS) + len(TOOL_TOKENS)} chat tokens); "
                "use e.g. --vocab 512"
            )
        if self.hidden_size % self.num_heads:
            raise InputError(
                f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}; "
                f"e.g. use --heads {_largest_divisor_at_most(self.hidden_size, self.num_heads)}"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise InputError(
                f"head_dim = hidden_size / num_heads = {self.hidden_size // self.num_heads} must be even "
                "(rotary embeddings rotate pairs of dimensions); pick hidden_size and num_heads so it is"
            )
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if not isinstance(self.num_kv_heads, int) or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise InputError(
                f"num_kv_heads={self.num_kv_heads!r} must be a positive divisor of num_heads={self.num_heads}"
            )
        if self.intermediate_size is None:
            self.intermediate_size = 3 * self.hidden_size
        if not isinstance(self.intermediate_size, int) or self.intermediate_size < 1:
            raise InputError(f"intermediate_size must be a positive integer, got {self.intermediate_size!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise InputError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def head_dim(self) -> int:
        """Per-head width of the attention projections."""
        return self.hidden_size // self.num_heads


def _largest_divisor_at_most(number: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if number % d == 0)


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------

_ADDED_TOKEN_SPLIT = re.compile(
    "|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS + TOOL_TOKENS, key=len, reverse=True))
)


def _training_pieces(texts: Iterable[str]) -> Iterable[str]:
    # At encode time the chat tokens are cut out before BPE runs, so train BPE on the text between them.
    for text in texts:
        for piece in _ADDED_TOKEN_SPLIT.split(text):
            if piece:
                yield piece


def _render_corpus_chats(chats: list[dict[str, Any]], tools_view: str = "full") -> list[str]:
    rendered = []
    for chat in tqdm(chats, desc="render chats", unit="chat", file=sys.stderr, disable=len(chats) < 500):
        rendered.append(render_chat(chat["messages"], chat.get("tools") or None, tools_view=tools_view))
    return rendered


def train_tokenizer(
    corpus_texts: list[str] | None = None,
    chats: list[dict[str, Any]] | None = None,
    *,
    vocab_size: int = 1024,
    min_frequency: int = 2,
    max_length: int = 4096,
    tools_view: str = "full",
) -> "PreTrainedTokenizerFast":
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer with CHAT_TEMPLATE.

    `corpus_texts` are plain strings; `chats` are records `{"messages": [...], "tools": [...]}` rendered with
    the chat template first. With neither, the built-in corpus is used. `tools_view` picks how the template
    lists tool schemas (`train.chat_template.TOOLS_VIEWS`: "full" JSON schemas, or "compact" one-line
    signatures for a model too small to spend ~1,300 prompt tokens on them). `vocab_size` counts everything
    (256 byte symbols, merges, chat tokens); BPE stops earlier when the corpus runs out of pairs seen
    `min_frequency` times. Returns a `PreTrainedTokenizerFast` (eos `<|im_end|>`, pad `<|endoftext|>`).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size={vocab_size} is below the minimum {MIN_VOCAB_SIZE}; use e.g. 512")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    if corpus_texts is None and chats is None:
        corpus_texts, chats = builtin_corpus()
    template = chat_template(tools_view)  # raises on an unknown view before any work
    texts = list(corpus_texts or []) + _render_corpus_chats(list(chats or []), tools_view)
    if not any(text.strip() for text in texts):
        raise ValueError("the tokenizer corpus is empty: pass some text or chats, or neither for the built-in corpus")

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets exact, which assistant-token masks are computed from.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),  # the tool tokens are added after training
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte has a symbol: no unknown tokens
        show_progress=False,
    )
    backend.train_from_iterator(_training_pieces(texts), trainer=trainer)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,  # byte-level: decode must give back the exact text
        model_max_length=max_length,
    )
    tokenizer.chat_template = template
    return tokenizer


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def _make_model(config: TinyModelConfig, tokenizer: "PreTrainedTokenizerFast") -> "Qwen3ForCausalLM":
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    model_config = Qwen3Config(
        vocab_size=len(tokenizer),  # every token id the tokenizer can produce, added tokens included
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(model_config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    return model


def _prepare_out_dir(out_dir: Path) -> None:
    """Refuse to overwrite a folder this module did not build (checked before any work is done)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / BUILD_INFO_FILE).is_file():
        raise InputError(
            f"{out_dir}: folder is not empty and was not built by train.tiny (no {BUILD_INFO_FILE}); "
            "pick another --out or empty it"
        )


def _make_readable(folder: Path) -> None:
    # mkdtemp/mkstemp create owner-only entries; give the build the usual umask permissions instead.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def _replace_dir(built: Path, out_dir: Path) -> None:
    # Move the old build aside first so the final step is one rename; the old copy is deleted afterwards.
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
        os.replace(out_dir, old / "previous")
    os.replace(built, out_dir)
    if old is not None:
        shutil.rmtree(old)


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    corpus_texts: list[str] | None = None,
    chats: list[dict[str, Any]] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    seed: int = 0,
    corpus_info: dict[str, Any] | None = None,
    tools_view: str = "full",
) -> Path:
    """Train the tokenizer, build a random-init Qwen3ForCausalLM and save both to `out_dir`.

    With neither `corpus_texts` nor `chats` the built-in corpus is used. The folder is written to a
    temporary sibling and renamed into place; an existing folder is replaced only if an earlier build
    wrote it (it has tiny_build.json). Returns `out_dir` as a Path.
    """
    config = TinyModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        seed=seed,
    )
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    builtin = corpus_texts is None and chats is None
    tokenizer = train_tokenizer(
        corpus_texts, chats, vocab_size=config.vocab_size, max_length=config.max_position_embeddings,
        tools_view=tools_view,
    )
    model = _make_model(config, tokenizer)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build.", dir=out_dir.parent))
    try:
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        info = {
            "format": BUILD_INFO_FORMAT,
            "config": asdict(config),
            "tokenizer_vocab_size": len(tokenizer),
            "tools_view": tools_view,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "corpus": corpus_info or {"source": "builtin" if builtin else "api"},
        }
        atomic_write_json(staging / BUILD_INFO_FILE, info)
        _make_readable(staging)
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _check_chat_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise InputError(f'{where}: expected an object with a non-empty "messages" list')
    for number, message in enumerate(record["messages"]):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f'{where}: messages[{number}] must be an object with a string "role"')
    tools = record.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InputError(f'{where}: "tools" must be a list of JSON schema objects')
    return {"messages": record["messages"], "tools": tools}


def load_corpus_files(paths: list[str | os.PathLike]) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Read `--corpus` files: `.jsonl` → chat records, anything else → plain UTF-8 text.

    Returns (texts, chats, file descriptions with sha256). Problems raise InputError naming the file.
    """
    texts: list[str] = []
    chats: list[dict[str, Any]] = []
    described = []
    for raw_path in paths:
        path = Path(raw_path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: file not found") from None
        except OSError as err:
            raise InputError(f"{path}: cannot read ({err})") from None
        if path.name.endswith(".jsonl"):
            records = load_jsonl(path)
            if not records:
                raise InputError(f"{path}: no chat records")
            for number, record in enumerate(records, start=1):
                chat = _check_chat_record(record, f"{path}: record {number}")
                try:
                    render_chat(chat["messages"], chat["tools"])
                except (TemplateError, TypeError, ValueError) as err:  # odd message shapes: name the record
                    raise InputError(
                        f"{path}: record {number} cannot be rendered with the chat template ({err})"
                    ) from None
                chats.append(chat)
            kind = "chats"
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}: not UTF-8 text ({err})") from None
            if not text.strip():
                raise InputError(f"{path}: empty text file")
            texts.append(text)
            kind = "text"
        described.append({"path": str(path), "kind": kind, "sha256": hashlib.sha256(data).hexdigest()})
    return texts, chats, described


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build a tiny model folder. Returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m train.tiny",
        description="Build a tiny random-init Qwen3 model and BPE tokenizer locally (no network).",
    )
    defaults = TinyModelConfig()
    parser.add_argument("--out", required=True, help="output folder (replaced if an earlier build made it)")
    parser.add_argument("--vocab", type=int, default=defaults.vocab_size, help="target vocabulary size")
    parser.add_argument("--hidden", type=int, default=defaults.hidden_size, help="hidden size")
    parser.add_argument("--layers", type=int, default=defaults.num_layers, help="number of decoder layers")
    parser.add_argument("--heads", type=int, default=defaults.num_heads, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    parser.add_argument("--ffn", type=int, default=None, help="MLP intermediate size (default: 3 x hidden)")
    parser.add_argument(
        "--corpus",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="tokenizer corpus: .jsonl chat records or plain text (default: built-in corpus)",
    )
    parser.add_argument("--seed", type=seed_value, default=0, help="weight-initialisation seed")
    parser.add_argument("--tools-view", choices=TOOLS_VIEWS, default="full",
                        help="how the chat template lists tool schemas: full JSON (default) or compact signatures")
    args = parser.parse_args(argv)
    for flag, value in (("--vocab", args.vocab), ("--hidden", args.hidden), ("--layers", args.layers),
                        ("--heads", args.heads), ("--kv-heads", args.kv_heads), ("--ffn", args.ffn)):
        if value is not None:  # by the flag's name (the config below says vocab_size, hidden_size, ...)
            check_int(value, flag, 1)
    TinyModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.ffn,
        seed=args.seed,
    )
    check_output_folder(args.out, "--out", [("a --corpus file", path) for path in args.corpus or ()])
    corpus_texts, chats, described = load_corpus_files(args.corpus) if args.corpus else (None, None, [])
    _prepare_out_dir(Path(args.out))
    corpus_info = {"source": "files", "files": described} if described else {"source": "builtin"}
    out = build_tiny_model(
        args.out,
        corpus_texts=corpus_texts,
        chats=chats,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.ffn,
        seed=args.seed,
        corpus_info=corpus_info,
        tools_view=args.tools_view,
    )
    info = json.loads((out / BUILD_INFO_FILE).read_text(encoding="utf-8"))
    if info["tokenizer_vocab_size"] < args.vocab:  # said, not silent: the corpus ran out of merges
        print(f"train.tiny: warning: the vocabulary has {info['tokenizer_vocab_size']:,} tokens, fewer than --vocab "
              f"{args.vocab:,}: the corpus has no more merges (a larger --corpus gives more)", file=sys.stderr)
    print(
        f"train.tiny: built {out} (vocab {info['tokenizer_vocab_size']}, {info['num_parameters']:,} parameters)",
        file=sys.stderr,
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
