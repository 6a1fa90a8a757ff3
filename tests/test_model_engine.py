"""The tiny policy model, the transformers engine and the vLLM adapter's pure parts."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from asearcher.cli.errors import CliError
from asearcher.cli.model import app
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.engines.base import GenerateParams, Generation, InferenceEngine, Tokenizer
from asearcher.producers.engines.hf_engine import TransformersEngine, tensor_checksum
from asearcher.producers.engines.vllm_engine import (
    VersionGate,
    VllmEngine,
    sampling_kwargs,
    to_generation,
)
from asearcher.producers.policy.model_init import EOS_TOKEN, TAG_TOKENS, init_model
from asearcher.streams.storage.state_dicts import WeightLoadError
from asearcher.streams.storage.weight_reader import WeightStoreError
from asearcher.trainer.runtime.weight_publisher import WeightStore

GREEDY = GenerateParams(temperature=0.0, max_new_tokens=16)
PROMPTS = [
    "What is the capital of Tholavia?",
    "Hi",
    "Question: who wrote the book?\n<think>",
    "<search>university founded</search>\n\n<information>\nNo results.\n</information>\n\n",
    "A longer prompt, about a company in a city whose founder studied at a university.",
    "Port",
    "The population of the city is about",
    "Answer: <answer>",
]


def run(coro):
    return asyncio.run(coro)


def run_together(*coros, return_exceptions: bool = False) -> list:
    """Run coroutines concurrently in one event loop, results in order."""

    async def together() -> list:
        return await asyncio.gather(*coros, return_exceptions=return_exceptions)

    return asyncio.run(together())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = generate_world(seed=1, entities=60, questions=20)
    return write_world(world, tmp_path_factory.mktemp("world"))["corpus"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    return init_model(tmp_path_factory.mktemp("model"), corpus, seed=0)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[TransformersEngine]:
    """Shared by the tests that only generate; weight loads get their own engine."""
    engine = TransformersEngine.from_pretrained(model_dir)
    yield engine
    run(engine.close())


def encode_all(engine: TransformersEngine) -> list[list[int]]:
    return [engine.tokenizer.encode(text) for text in PROMPTS]


def full_forward_logprobs(
    engine: TransformersEngine, prompt: list[int], output: Generation, temperature: float
) -> list[float]:
    """Log-probs of `output` recomputed from one forward pass over prompt + output."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + output.token_ids])).logits[0].float()
    scaled = logits / temperature if temperature > 0 else logits
    logprobs = torch.log_softmax(scaled, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(output.token_ids)]


# ------------------------------------------------------------------ model init


def test_init_model_same_seed_gives_identical_files_other_seed_other_weights(
    tmp_path: Path, corpus: Path, model_dir: Path
) -> None:
    again = init_model(tmp_path / "again", corpus, seed=0)
    other = init_model(tmp_path / "other", corpus, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        model_dir / "model.safetensors"
    ).read_bytes()


def test_init_model_dir_loads_with_auto_classes_as_tied_qwen2(model_dir: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "qwen2"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.vocab_size == len(tokenizer) <= 4096
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == EOS_TOKEN
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id
    saved = load_file(model_dir / "model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 10_000_000
    assert (model_dir / "generation_config.json").is_file()


def test_tags_are_single_tokens_and_decode_gives_back_the_text(
    engine: TransformersEngine, model_dir: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = engine.tokenizer
    for tag in TAG_TOKENS:
        ids = tokenizer.encode(tag)
        assert len(ids) == 1 and tokenizer.decode(ids) == tag, tag
    turn = (
        "<think>Who founded it?</think>\n<search>Zatobrous founder</search>\n\n<information>\n"
        "[1] Port Zatobrous — a city of 3,516,832 people; café “Ölm”.\n</information>\n\n"
        f"<answer>Tholavia</answer>{EOS_TOKEN}"
    )
    ids = tokenizer.encode(turn)
    assert tokenizer.decode(ids) == turn
    assert ids[-1] == tokenizer.eos_token_id
    # transformers rebuilds a qwen2 tokenizer's pipeline; it must be the one tokenizer.json holds.
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode(turn).ids == ids


# ------------------------------------------------------------------ generation


def test_engine_fits_the_interface_and_max_new_tokens_ends_with_length(
    engine: TransformersEngine,
) -> None:
    prompt = engine.tokenizer.encode(PROMPTS[0])
    assert isinstance(engine, InferenceEngine) and isinstance(engine.tokenizer, Tokenizer)
    out = run(engine.generate(prompt, GenerateParams(temperature=0.0, max_new_tokens=5)))
    assert (len(out.token_ids), len(out.logprobs), out.finish_reason) == (5, 5, "length")
    assert out.version == 0 and out.stop is None


def test_generate_stop_string_ends_output_at_the_token_completing_it(
    engine: TransformersEngine,
) -> None:
    tokenizer = engine.tokenizer
    prompt = tokenizer.encode(PROMPTS[2])
    free = run(engine.generate(prompt, GenerateParams(temperature=0.0, max_new_tokens=40)))
    # A stop string spanning tokens k..k+2 whose first occurrence ends exactly with token k+2.
    for k in range(2, 30):
        stop = tokenizer.decode(free.token_ids[k : k + 3])
        if stop.strip() and stop not in tokenizer.decode(free.token_ids[: k + 2]):
            break
    params = GenerateParams(temperature=0.0, max_new_tokens=40, stop=("never-generated", stop))
    out, other = run_together(engine.generate(prompt, params), engine.generate(prompt, GREEDY))
    assert out.token_ids == free.token_ids[: k + 3]
    assert (out.finish_reason, out.stop) == ("stop", stop)
    assert tokenizer.decode(out.token_ids).endswith(stop)
    assert other.finish_reason == "length" and len(other.token_ids) == 16  # rows stop alone


def test_greedy_is_deterministic_and_batched_equals_unbatched(
    engine: TransformersEngine,
) -> None:
    prompts = encode_all(engine)
    one_by_one = [run(engine.generate(p, GREEDY)) for p in prompts]
    again = [run(engine.generate(p, GREEDY)) for p in prompts]
    before = engine.stats.largest_batch
    batched = run_together(*(engine.generate(p, GREEDY) for p in prompts))
    assert engine.stats.largest_batch == len(prompts) > before  # really one batch
    assert [g.token_ids for g in again] == [g.token_ids for g in one_by_one]
    assert [g.token_ids for g in batched] == [g.token_ids for g in one_by_one]
    for single, joint in zip(one_by_one, batched, strict=True):
        assert single.logprobs == pytest.approx(joint.logprobs, abs=1e-5)


async def joining_scenario(
    engine: TransformersEngine, first: tuple[list[int], int], later: list[tuple[list[int], int]]
) -> tuple[Generation, list[Generation], bool]:
    """Greedy `first` (prompt, tokens), then each of `later` sent once it is decoding: its
    output, theirs, and whether they all finished while `first` was still decoding."""
    running = asyncio.ensure_future(engine.generate(first[0], greedy(first[1])))
    while not engine._batch:  # until its row is decoding  # noqa: SLF001
        await asyncio.sleep(0.001)
    outs = await asyncio.gather(*(engine.generate(p, greedy(n)) for p, n in later))
    overtaken = not running.done()
    return await running, outs, overtaken


def greedy(tokens: int) -> GenerateParams:
    return GenerateParams(temperature=0.0, max_new_tokens=tokens)


def test_calls_join_the_running_batch_and_leave_it_when_done(
    engine: TransformersEngine,
) -> None:
    short, long_prompt, other = (engine.tokenizer.encode(PROMPTS[i]) for i in (1, 4, 5))
    # A row joins a batch whose cache is shorter than its prompt (the batch is padded) and
    # one longer (the row is padded); both leave while the first row still decodes.
    later = [(long_prompt, 6), (other, 3)]
    alone = [run(engine.generate(p, greedy(n))) for p, n in [(short, 120), *later]]
    joins_before = engine.stats.batches
    first, outs, overtaken = run(joining_scenario(engine, (short, 120), later))
    assert overtaken and engine.stats.largest_batch >= 2
    assert engine.stats.batches - joins_before >= 2  # joined after the first row's prefill
    for solo, joint in zip(alone, [first, *outs], strict=True):
        assert joint.token_ids == solo.token_ids
        assert joint.logprobs == pytest.approx(solo.logprobs, abs=1e-4)


def test_more_calls_than_the_batch_holds_each_join_as_a_row_leaves(model_dir: Path) -> None:
    engine = TransformersEngine.from_pretrained(model_dir, max_batch=2)
    prompts = encode_all(engine)[:5]
    lengths = [30, 4, 12, 7, 20]
    try:
        alone = [run(engine.generate(p, greedy(n))) for p, n in zip(prompts, lengths, strict=True)]
        joined = run_together(
            *(asyncio.wait_for(engine.generate(p, greedy(n)), 60)
              for p, n in zip(prompts, lengths, strict=True))
        )  # fmt: skip
    finally:
        run(engine.close())
    assert [g.token_ids for g in joined] == [g.token_ids for g in alone]
    assert engine.stats.largest_batch == 2


def test_a_model_whose_cache_cannot_merge_rows_decodes_whole_batches(model_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    config.sliding_window = 4096  # wider than any prompt here: outputs are unchanged
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config)
    engine = TransformersEngine(model, AutoTokenizer.from_pretrained(model_dir))
    short, other = (engine.tokenizer.encode(PROMPTS[i]) for i in (1, 5))
    try:
        first, outs, overtaken = run(joining_scenario(engine, (short, 120), [(other, 3)]))
    finally:
        run(engine.close())
    assert not overtaken and engine.stats.largest_batch == 1  # it waited for the batch to end
    assert len(first.token_ids) == 120 and len(outs[0].token_ids) == 3


def test_a_failing_forward_fails_every_call_it_held_and_the_engine_goes_on(
    model_dir: Path,
) -> None:
    engine = TransformersEngine.from_pretrained(model_dir)
    prompts = encode_all(engine)[:3]
    forward = engine.model.forward

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    try:
        engine.model.forward = broken
        failed = run_together(
            *(asyncio.wait_for(engine.generate(p, GREEDY), 60) for p in prompts),
            return_exceptions=True,
        )
        engine.model.forward = forward
        after = run(engine.generate(prompts[0], GREEDY))
    finally:
        run(engine.close())
    assert [str(e) for e in failed] == ["out of memory (simulated)"] * len(prompts)
    assert len(after.token_ids) == GREEDY.max_new_tokens


def test_logprobs_equal_a_full_forward_recomputation(engine: TransformersEngine) -> None:
    prompts = encode_all(engine)[:4]
    params = [
        GenerateParams(temperature=0.0, max_new_tokens=12),
        GenerateParams(temperature=0.7, max_new_tokens=12, seed=1),
        GenerateParams(temperature=1.0, top_p=0.8, max_new_tokens=12, seed=2),
        GenerateParams(temperature=1.3, max_new_tokens=12, seed=3),
    ]
    outs = run_together(*(engine.generate(p, q) for p, q in zip(prompts, params, strict=True)))
    for prompt, param, out in zip(prompts, params, outs, strict=True):
        expected = full_forward_logprobs(engine, prompt, out, param.temperature)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_seeded_sampling_reproducible_and_top_p_logprobs_are_untruncated(
    engine: TransformersEngine,
) -> None:
    prompt = engine.tokenizer.encode(PROMPTS[0])
    sampled = GenerateParams(temperature=1.0, max_new_tokens=20, seed=11)
    first = run(engine.generate(prompt, sampled))
    # The same seed gives the same tokens, even when batched with other calls.
    second, _ = run_together(engine.generate(prompt, sampled), engine.generate(prompt, GREEDY))
    other = run(
        engine.generate(prompt, GenerateParams(temperature=1.0, max_new_tokens=20, seed=12))
    )
    assert first.token_ids == second.token_ids
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-5)
    assert first.token_ids != other.token_ids
    # A tiny top-p keeps only the most likely token, but its log-prob is the full softmax's.
    narrow = run(
        engine.generate(prompt, GenerateParams(temperature=1.0, top_p=1e-6, max_new_tokens=8))
    )
    greedy = run(engine.generate(prompt, GenerateParams(temperature=0.0, max_new_tokens=8)))
    assert narrow.token_ids == greedy.token_ids
    assert narrow.logprobs == pytest.approx(greedy.logprobs, abs=1e-5)
    assert max(narrow.logprobs) < -0.01


def test_generate_stops_at_eos_and_keeps_it_then_close_refuses_calls(model_dir: Path) -> None:
    engine = TransformersEngine.from_pretrained(model_dir)
    try:
        # A zero final norm makes every logit 0: greedy picks the first id, which is eos.
        with torch.no_grad():
            engine.model.model.norm.weight.zero_()
        out = run(engine.generate(engine.tokenizer.encode("Hi"), GREEDY))
    finally:
        run(engine.close())
    with pytest.raises(RuntimeError, match="closed"):
        run(engine.generate(engine.tokenizer.encode("Hi"), GREEDY))
    eos = engine.tokenizer.eos_token_id
    assert (out.token_ids, out.finish_reason) == ([eos], "eos")
    assert out.logprobs == pytest.approx([-math.log(engine.model.config.vocab_size)], abs=1e-4)


# ------------------------------------------------------------------ weights


def perturbed_state_dict(engine: TransformersEngine, seed: int) -> dict[str, torch.Tensor]:
    """The engine's weights plus noise, with the tied lm_head kept equal to the embeddings."""
    generator = torch.Generator().manual_seed(seed)
    state = {name: t.detach().clone() for name, t in engine.model.state_dict().items()}
    for tensor in state.values():
        tensor += 0.05 * torch.randn(tensor.shape, generator=generator)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def test_load_weights_switches_version_and_parameters_between_calls(
    model_dir: Path, tmp_path: Path
) -> None:
    store = WeightStore((tmp_path / "weights").as_uri())
    engine = TransformersEngine.from_pretrained(model_dir)
    prompt = engine.tokenizer.encode(PROMPTS[0])
    long_greedy = GenerateParams(temperature=0.0, max_new_tokens=24)
    state = perturbed_state_dict(engine, seed=5)
    published = store.publish_state_dict(1, step=10, parent_version=0, state_dict=state)
    original = engine.state_dict_checksum()

    async def scenario() -> tuple[Generation, Generation, Generation]:
        # A call already running finishes on version 0; the load then goes ahead of the calls
        # still waiting, so both of them run on version 1.
        running = asyncio.ensure_future(engine.generate(prompt, long_greedy))
        await asyncio.sleep(0)
        while engine._pending:  # until the worker has taken it  # noqa: SLF001
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(engine.generate(prompt, long_greedy))
        await asyncio.sleep(0)
        await engine.load_weights(published.uri, 1, published.sha256)
        return await running, await waiting, await engine.generate(prompt, long_greedy)

    try:
        before, queued, after = run(scenario())
        assert (before.version, queued.version, after.version, engine.version) == (0, 1, 1, 1)
        assert queued.token_ids == after.token_ids
        assert before.token_ids != after.token_ids
        assert engine.state_dict_checksum() == tensor_checksum(state) != original
    finally:
        run(engine.close())


def test_load_weights_bad_hash_or_shape_raises_and_keeps_the_old_version(
    model_dir: Path, tmp_path: Path
) -> None:
    store = WeightStore((tmp_path / "weights").as_uri())
    engine = TransformersEngine.from_pretrained(model_dir)
    state = perturbed_state_dict(engine, seed=6)
    tied_once = {k: v for k, v in state.items() if k != "lm_head.weight"}
    good = store.publish_state_dict(1, step=1, parent_version=0, state_dict=tied_once)
    bad_shape = dict(tied_once, **{"model.norm.weight": torch.ones(3)})
    misfit = store.publish_state_dict(2, step=2, parent_version=1, state_dict=bad_shape)
    try:
        run(engine.load_weights(good.uri, 1, good.sha256))  # lm_head absent: filled by the tie
        loaded = engine.state_dict_checksum()
        assert loaded == tensor_checksum(state)
        with pytest.raises(WeightStoreError):
            run(engine.load_weights(misfit.uri, 2, "0" * 64))
        with pytest.raises(WeightLoadError, match="shape"):
            run(engine.load_weights(misfit.uri, 2, misfit.sha256))
        assert engine.version == 1 and engine.state_dict_checksum() == loaded
        out = run(engine.generate(engine.tokenizer.encode("Hi"), GREEDY))
        assert out.version == 1
    finally:
        run(engine.close())


def test_load_tensors_takes_a_state_dict_from_memory_and_refuses_a_misfit_whole(
    model_dir: Path,
) -> None:
    engine = TransformersEngine.from_pretrained(model_dir)
    state = perturbed_state_dict(engine, seed=7)
    tied_once = {k: v for k, v in state.items() if k != "lm_head.weight"}
    prompt = engine.tokenizer.encode(PROMPTS[0])
    try:
        before = run(engine.generate(prompt, GREEDY))
        run(engine.load_tensors(tied_once, 3))
        loaded = engine.state_dict_checksum()
        assert loaded == tensor_checksum(state)
        after = run(engine.generate(prompt, GREEDY))
        assert (before.version, after.version) == (0, 3)
        with pytest.raises(WeightLoadError, match="shape"):
            run(engine.load_tensors(dict(tied_once, **{"model.norm.weight": torch.ones(3)}), 4))
        assert engine.version == 3 and engine.state_dict_checksum() == loaded
    finally:
        run(engine.close())


# ------------------------------------------------------------------ vLLM adapter


def test_vllm_engine_without_vllm_raises_a_one_line_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    with pytest.raises(ImportError) as raised:
        VllmEngine("/nonexistent/model")
    message = str(raised.value)
    assert "\n" not in message and "pip install 'asearcher[vllm]'" in message


def test_vllm_sampling_kwargs_and_outputs_map_to_the_engine_interface() -> None:
    params = GenerateParams(temperature=0.7, top_p=0.9, max_new_tokens=9, stop=("</a>",), seed=3)
    kwargs = sampling_kwargs(params)
    assert (kwargs["max_tokens"], kwargs["stop"], kwargs["seed"], kwargs["logprobs"]) == (
        9,
        ["</a>"],
        3,
        0,
    )
    assert kwargs["include_stop_str_in_output"] and not kwargs["skip_special_tokens"]

    def output(finish: str, stop_reason: object) -> SimpleNamespace:
        steps = [{5: SimpleNamespace(logprob=-0.5)}, {7: SimpleNamespace(logprob=-1.5)}]
        return SimpleNamespace(
            token_ids=[5, 7], logprobs=steps, finish_reason=finish, stop_reason=stop_reason
        )

    stopped = to_generation(output("stop", "</a>"), version=4)
    assert (stopped.token_ids, stopped.logprobs, stopped.version) == ([5, 7], [-0.5, -1.5], 4)
    assert (stopped.finish_reason, stopped.stop) == ("stop", "</a>")
    assert to_generation(output("stop", None), 4).finish_reason == "eos"
    assert to_generation(output("length", None), 4).finish_reason == "length"
    with pytest.raises(RuntimeError):
        to_generation(output("abort", None), 4)


def test_version_gate_load_waits_for_calls_in_flight_and_holds_new_ones() -> None:
    async def scenario() -> list[str]:
        gate, events = VersionGate(), []
        release = asyncio.Event()

        async def call(name: str, hold: asyncio.Event | None = None) -> None:
            async with gate.generating():
                events.append(f"{name} start")
                if hold is not None:
                    await hold.wait()
                events.append(f"{name} end")

        async def load() -> None:
            async with gate.loading():
                events.append("load")

        first = asyncio.create_task(call("a", release))
        await asyncio.sleep(0)
        loading = asyncio.create_task(load())
        await asyncio.sleep(0)
        late = asyncio.create_task(call("b"))
        await asyncio.sleep(0.01)
        assert events == ["a start"]  # the load waits for a; b waits for the load
        release.set()
        await asyncio.gather(first, loading, late)
        return events

    assert run(scenario()) == ["a start", "a end", "load", "b start", "b end"]


# ------------------------------------------------------------------ CLI


def test_cli_model_init_writes_a_model_and_reports_bad_input(tmp_path: Path, corpus: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli-model"
    args = ["init", "--out", str(out), "--corpus", str(corpus), "--hidden-size", "64"]
    result = runner.invoke(app, [*args, "--layers", "1", "--vocab-size", "512"])
    assert result.exit_code == 0, result.output
    assert "parameters written to" in result.output and str(out) in result.output.replace("\n", "")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(out)
    assert (config.num_hidden_layers, config.hidden_size) == (1, 64)
    assert config.vocab_size <= 512
    missing = runner.invoke(app, ["init", "--out", str(out), "--corpus", str(tmp_path / "nope")])
    assert isinstance(missing.exception, CliError) and "--corpus" in str(missing.exception)


def test_cli_model_init_pretrains_to_copy_then_to_read_and_says_what_it_reached(
    tmp_path: Path, corpus: Path
) -> None:
    out = tmp_path / "reader"
    args = ["init", "--out", str(out), "--corpus", str(corpus), "--hidden-size", "64",
            "--layers", "1", "--vocab-size", "512",
            "--pretrain-steps", "3", "--reading-steps", "2", "--reading-lead", "50"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "pretrained 3 steps to copy and 2 to read" in said
    assert "reads: answers" in said and "of questions about an unseen world's pages" in said
    assert "of them 300 tokens into a sequence (read after up to 50 tokens of text)" in said
    from asearcher.producers.policy.model_init import PolicySpec, read_pretraining

    report = read_pretraining(out)
    assert report is not None and (report.steps, report.reading_steps) == (3, 2)
    assert report.reading_loss is not None and report.reading_after is not None
    assert report.reading_far is not None and report.reading_lead == 50
    bad = CliRunner().invoke(app, [*args[:2], str(tmp_path / "x"), "--reading-steps", "-1"])
    assert isinstance(bad.exception, CliError) and "--reading-steps" in str(bad.exception)
    # A policy read with leads is another policy: runs of each shape keep their own.
    keys = {PolicySpec(reading_steps=2, reading_lead=lead).key() for lead in (0, 50)}
    assert len(keys) == 2 and PolicySpec(reading_lead=50).key() == PolicySpec().key()
