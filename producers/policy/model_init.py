"""A tiny, randomly initialised policy in standard Hugging Face format, for CPU runs and tests.

Inputs: the synthetic world's corpus (`corpus.jsonl` of url/title/contents, or a default world
generated in memory) and the model sizes. Output: a directory any Hugging Face loader reads —
`config.json`, `model.safetensors`, `generation_config.json` and the tokenizer files — so the code
that loads it loads a real checkpoint (e.g. Qwen2.5-7B) unchanged.

Components: `train_tokenizer` fits a byte-level BPE on the corpus and adds the agent's tags as
single tokens; `build_model` makes a `Qwen2ForCausalLM` with tied embeddings from a seed.
Same seed and corpus give the same tokenizer file bytes and identical weights.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta

from asearcher.consumers.formats.action_format import ACTION_TAGS
from asearcher.producers.policy import reading
from asearcher.producers.policy.pretrain import (
    FAR_LEAD,
    RECIPE,
    Progress,
    copy_accuracy,
    pretrain,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EOS_TOKEN = "<|endoftext|>"
# Non-special added tokens: each tag is one token, and decoding keeps it.
TAG_TOKENS: tuple[str, ...] = tuple(
    f"<{slash}{tag}>" for tag in (*ACTION_TAGS, "information", "think") for slash in ("", "/")
)
# Qwen2's pre-tokenisation. transformers rebuilds a `qwen2` tokenizer's pipeline from its class,
# so ours must be the same one or tokenisation would differ between loaders.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOKENIZER_CLASS = "Qwen2Tokenizer"
ROPE_THETA = 1_000_000.0  # Qwen2.5's, so long contexts behave like the real model's
DEFAULT_ENTITIES = 300
PRETRAINING_FILE = "pretraining.json"


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The CPU policy `init_model` creates: its shape (the defaults: ~3.9M parameters), how
    long it is pretrained to copy from its context (`pretrain.py`; 0: random weights) and then
    to answer questions from pages of other worlds (`reading.py`; 0: not at all).

    Heads are 64 wide and half of them key/value heads, the MLP ~2.75x the width, as Qwen2's.
    """

    vocab_size: Annotated[int, Meta(description="most tokens the tokenizer may have")] = 4096
    hidden_size: Annotated[int, Meta(description="width of the Qwen2 policy")] = 256
    layers: Annotated[int, Meta(description="transformer layers of the policy")] = 4
    pretrain_steps: Annotated[
        int,
        Meta(
            description="steps pretraining the policy to copy from its context (0: random weights)"
        ),
    ] = 0
    reading_steps: Annotated[
        int,
        Meta(
            description="steps then pretraining it to answer from pages of other worlds (0: none)"
        ),
    ] = 0
    reading_lead: Annotated[
        int,
        Meta(
            description="most tokens of world text before each reading item, so that it reads "
            "where an agent's pages stand (0: items open their sequence)"
        ),
    ] = 0

    def __post_init__(self) -> None:
        if self.hidden_size < 64 or self.hidden_size % 64:
            raise ValueError(
                f"hidden_size must be a positive multiple of 64, not {self.hidden_size}"
            )
        if self.layers < 1:
            raise ValueError(f"layers must be at least 1, not {self.layers}")
        if self.pretrain_steps < 0:
            raise ValueError(f"pretrain_steps must be at least 0, not {self.pretrain_steps}")
        if self.reading_steps < 0:
            raise ValueError(f"reading_steps must be at least 0, not {self.reading_steps}")
        if self.reading_lead < 0:
            raise ValueError(f"reading_lead must be at least 0, not {self.reading_lead}")
        if self.vocab_size <= len(TAG_TOKENS) + 257:
            raise ValueError(f"vocab_size must exceed {len(TAG_TOKENS) + 257} (bytes, eos, tags)")

    @property
    def heads(self) -> int:
        return self.hidden_size // 64

    @property
    def kv_heads(self) -> int:
        return self.heads // 2 if self.heads % 2 == 0 else self.heads

    @property
    def intermediate_size(self) -> int:
        return round(self.hidden_size * 2.75 / 64) * 64

    def key(self) -> str:
        """A short name of this shape, for directory names."""
        key = f"v{self.vocab_size}-h{self.hidden_size}-l{self.layers}"
        key += f"-p{self.pretrain_steps}r{RECIPE}" if self.pretrain_steps else ""
        key += f"-read{self.reading_steps}" if self.reading_steps else ""
        leads = self.reading_steps and self.reading_lead
        return key + (f"-lead{self.reading_lead}" if leads else "")

    def init_kwargs(self) -> dict[str, int]:
        """`init_model`'s keyword arguments for this shape."""
        return {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
            "intermediate_size": self.intermediate_size, "pretrain_steps": self.pretrain_steps,
            "reading_steps": self.reading_steps, "reading_lead": self.reading_lead,
        }  # fmt: skip


class _CorpusLine(msgspec.Struct):
    title: str = ""
    contents: str = ""


def corpus_texts(corpus: Path | None, seed: int = 0) -> Iterator[str]:
    """Page texts of `corpus.jsonl`, or of a default synthetic world when `corpus` is None."""
    if corpus is None:
        from asearcher.consumers.world.world import generate_world

        world = generate_world(seed, entities=DEFAULT_ENTITIES)
        yield from (f"{page.title}\n{page.contents}" for page in world.pages)
        return
    decoder = msgspec.json.Decoder(_CorpusLine)
    with open(corpus, "rb") as lines:
        for line in lines:
            if line.strip():
                page = decoder.decode(line)
                yield f"{page.title}\n{page.contents}"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` tokens: eos first, the tags last.

    Text is NFC-normalised (as Qwen2 does), so decode(encode(text)) == text for NFC text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer, max_positions: int) -> PreTrainedTokenizerBase:
    """The tokenizer as a `transformers` fast tokenizer with eos and pad set."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=max_positions,
    )


def build_model(
    vocab_size: int,
    eos_token_id: int,
    *,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate_size: int,
    max_positions: int,
    seed: int,
) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM with tied embeddings, from `seed` alone."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    # A private RNG stream: the caller's global torch seed is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return model.eval()


def init_model(
    out_dir: Path,
    corpus: Path | None = None,
    *,
    vocab_size: int = 4096,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 704,
    max_positions: int = 32768,
    seed: int = 0,
    pretrain_steps: int = 0,
    reading_steps: int = 0,
    reading_lead: int = 0,
    progress: Progress | None = None,
) -> Path:
    """Train a tokenizer on `corpus`, build a random Qwen2 model and save both into `out_dir`;
    with `pretrain_steps`, pretrain the model to copy from its context first (`pretrain.py`),
    with `reading_steps` then to read (`reading.py`, after leads of up to `reading_lead`
    tokens of the corpus), calling `progress` after each step with
    the steps of both counted together, and write what it reached to `pretraining.json`.

    `vocab_size` is an upper bound: the model has one embedding row per token the tokenizer
    ends up with (a small corpus may give fewer merges). Returns `out_dir`.
    """
    if vocab_size <= len(TAG_TOKENS) + 257:
        raise ValueError(f"vocab_size must exceed {len(TAG_TOKENS) + 257} (bytes, eos, tags)")
    if corpus is not None and not corpus.is_file():
        raise ValueError(f"corpus {corpus} is not a file")
    tokenizer = wrap_tokenizer(
        train_tokenizer(corpus_texts(corpus, seed), vocab_size), max_positions
    )
    model = build_model(
        len(tokenizer),
        tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        hidden_size=hidden_size,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
        seed=seed,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if pretrain_steps or reading_steps:
        steps = (pretrain_steps, reading_steps, reading_lead)
        report = _pretrain(model, tokenizer, corpus, steps, seed, progress)
        (out_dir / PRETRAINING_FILE).write_bytes(msgspec.json.encode(report) + b"\n")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _declare_tokenizer_class(out_dir / "tokenizer_config.json")
    return out_dir


class PretrainingReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the pretraining of a policy reached (`pretraining.json` beside its weights)."""

    steps: int
    recipe: int
    loss: float | None  # of the last copy step, on the repeats (None: no copy steps)
    copy_before: float  # `copy_accuracy` of the random initialisation
    copy_after: float
    # `copy_accuracy` FAR_LEAD tokens into a sequence (None: a report from before it was probed)
    copy_far: float | None = None
    seconds: float  # both phases
    reading_steps: int = 0
    reading_loss: float | None = None  # of the last reading step, on the answers
    reading_before: float | None = None  # `reading_accuracy` on an unseen world, after copying
    reading_after: float | None = None
    # `reading_accuracy` FAR_LEAD random tokens into a sequence (None: not probed)
    reading_far: float | None = None
    reading_lead: int = 0  # most tokens of world text before a reading item


def read_pretraining(model_dir: Path) -> PretrainingReport | None:
    """The pretraining report of the policy in `model_dir`; None if it was not pretrained here."""
    path = Path(model_dir) / PRETRAINING_FILE
    if not path.is_file():
        return None
    return msgspec.json.decode(path.read_bytes(), type=PretrainingReport)


def _pretrain(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    corpus: Path | None,
    steps: tuple[int, int, int],
    seed: int,
    progress: Progress | None,
) -> PretrainingReport:
    started = time.perf_counter()
    copy_steps, reading_steps, reading_lead = steps
    pad = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    before = copy_accuracy(model, len(tokenizer), pad, seed)
    loss = None
    # The corpus's tokens: what the copy steps repeat and the reading leads are cut from.
    ids: list[int] = []
    if copy_steps or (reading_steps and reading_lead):
        ids = [i for text in corpus_texts(corpus, seed) for i in tokenizer(text)["input_ids"]]
    if copy_steps:
        overall = None if progress is None else _offset(progress, 0, copy_steps + reading_steps)
        loss = pretrain(model, ids, copy_steps, seed, pad, overall)
    report = PretrainingReport(
        steps=copy_steps, recipe=RECIPE, loss=loss, copy_before=before,
        copy_after=copy_accuracy(model, len(tokenizer), pad, seed),
        copy_far=copy_accuracy(model, len(tokenizer), pad, seed, lead=FAR_LEAD), seconds=0.0,
    )  # fmt: skip
    if reading_steps:
        lead = (reading_lead, ids)
        report = _pretrain_reading(model, tokenizer, report, reading_steps, seed, progress, lead)
    return msgspec.structs.replace(report, seconds=time.perf_counter() - started)


def _pretrain_reading(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    report: PretrainingReport,
    steps: int,
    seed: int,
    progress: Progress | None,
    lead: tuple[int, list[int]],
) -> PretrainingReport:
    def encode(text: str) -> list[int]:
        return tokenizer(text)["input_ids"]

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    probe = reading.probe_items(encode, eos)
    before = reading.reading_accuracy(model, probe)
    overall = None if progress is None else _offset(progress, report.steps, report.steps + steps)
    loss = reading.pretrain_reading(
        model, reading.training_items(encode, eos), steps, seed, eos, overall, *lead
    )
    return msgspec.structs.replace(
        report, reading_steps=steps, reading_loss=loss, reading_before=before,
        reading_after=reading.reading_accuracy(model, probe), reading_lead=lead[0],
        reading_far=reading.reading_accuracy(model, probe, FAR_LEAD, len(tokenizer)),
    )  # fmt: skip


def _offset(progress: Progress, done: int, total: int) -> Progress:
    """`progress` for a phase that starts after `done` of `total` steps."""
    return lambda step, _, loss: progress(done + step, total, loss)


def _declare_tokenizer_class(config_file: Path) -> None:
    # Loaders of any transformers version (and vLLM's) then pick the Qwen2 tokenizer, whose
    # pipeline is the one tokenizer.json holds.
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = TOKENIZER_CLASS
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def parameter_count(model_dir: Path) -> int:
    """Parameters in `model_dir/model.safetensors` (a tied matrix is stored and counted once)."""
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
