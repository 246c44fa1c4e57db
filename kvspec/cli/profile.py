"""``kvspec profile LAYOUT --model DIR -o FILE.profile.yaml``: measure a running engine's
step times over a grid of batch shapes, fit the step-time model and write the profile
(docs/latency.md#profiling-your-engine).

The engine runs in a child process (:mod:`kvspec.integrations.vllm.profile_engine`),
vLLM's in-process engine held to the layout's artifact by kvspec's plugin in verify
mode; this process reads its events, draws the progress bar, fits and writes."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from kvspec.cli.common import (
    USAGE,
    check_output,
    echo_json,
    format_option,
    note,
    parents_option,
    parse_bytes,
    progress,
    quiet_option,
)
from kvspec.cli.common import command as cli_command
from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, KvspecError, UsageError
from kvspec.files import emit

#: The environment the engine child gets on top of this one's.
PLUGIN_MODE = "verify"
#: The error lines of a refusal worth showing (the plugin's own message first).
_SHOWN = 12


@cli_command("profile", short_help="Measure a running engine's step times; write a profile.")
@click.argument("layout", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "model", required=True, type=click.Path(path_type=Path),
              help="The model's directory (its config.json and weights), as the engine "
                   "loads it.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="The profile to write (NAME.profile.yaml).")
@click.option("--engine", type=click.Choice(["vllm"]), default="vllm", show_default=True,
              help="The engine to measure (vLLM, installed where kvspec runs).")
@click.option("--grid", type=click.Choice(["quick", "full"]), default="quick",
              show_default=True, help="The batch shapes to measure (docs/latency.md): "
              "quick, a few minutes on a CPU; full, more sizes and contexts.")
@click.option("--repeats", type=click.IntRange(1, 20),
              help="Runs of the grid (default: the grid's own, 2 quick, 3 full).")
@click.option("--memory", "--kv-cache-memory-bytes", "memory",
              help="KV cache memory per rank a source is compiled for (1GiB). Default: "
                   "the source's budget; an artifact has its own.")
@click.option("--force", is_flag=True, help="Replace an existing file that is not a profile.")
@format_option("text", "json", help="text: the fit's summary on stderr; json: the profile "
               "written and its fit, as one object on stdout.")
@parents_option
@quiet_option
def command(layout: Path, model: Path, output: Path, engine: str, grid: str,
            repeats: int | None, memory: str | None, force: bool, fmt: str, parents: bool,
            quiet: bool) -> int:
    """Measure a running engine's step times; write a profile.

    Starts vLLM on --model with kvspec's plugin in verify mode, so the engine runs
    LAYOUT's plan (a source is compiled first), drives a grid of batch shapes
    (prefill chunks at several context lengths, decode batches of several sizes
    and contexts, decodes mixed with prefills), times each step in the engine's
    process, fits the linear step-time model (non-negative least squares) and
    writes the profile: what it describes, the coefficients, the measured range
    and the fit's residuals. `kvspec simulate --profile FILE` runs on it. Needs
    vLLM (on a CPU: scripts/install-cpu-engine.sh)."""
    check_output(output, suffixes=(".profile.yaml", ".yaml"), force=force, parents=parents,
                 inputs=(layout,), ours=_ours)
    _check_model(model)
    _require_engine()
    with _artifact(layout, memory) as artifact:
        measured = _measure(artifact, model, grid, repeats, quiet)
    # deferred: the fit and the profile's model (pydantic) load when the command runs
    from kvspec.integrations.vllm.profiling import fit_steps
    from kvspec.source.profile import fit_profile, profile_text

    trimmed = fit_steps([(int(s[0]), int(s[1]), int(s[2]), int(s[3]), float(s[4]))
                         for s in measured["steps"]])
    command_line = "kvspec profile " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["profile"]
                                                  else [str(layout), "--model", str(model),
                                                        "--grid", grid, "-o", str(output)])
    profile = fit_profile(trimmed.fit, trimmed.measured, measured["describes"], command_line)
    record = profile.fit.model_copy(update={"max_relative_error":  # type: ignore[union-attr]
                                            round(trimmed.max_relative, 4)})
    note_text = _note(measured, trimmed)
    profile = profile.model_copy(update={
        "fit": record,
        "provenance": profile.provenance.model_copy(update={"note": note_text})})
    emit(profile_text(profile), output, quiet=quiet or fmt == "json")
    fit = trimmed.fit
    if fmt == "json":
        echo_json({"profile": str(output), "samples": fit.samples, "steps": trimmed.steps,
                   "left_out": len(trimmed.dropped), "rms_residual_s": fit.rms,
                   "mean_relative_error": fit.relative(trimmed.measured),
                   "max_relative_error": trimmed.max_relative})
        return EXIT_OK
    note(f"fitted {fit.samples} batch shapes of {trimmed.steps} steps ({len(trimmed.dropped)} "
         "left out as interrupted): "
         f"rms residual {fit.rms * 1000:.3g} ms, mean relative error "
         f"{fit.relative(trimmed.measured):.1%}, max {trimmed.max_relative:.1%}", quiet=quiet)
    return EXIT_OK


def _ours(text: str) -> bool:
    return "kvspec_profile:" in text[:4096]


def _check_model(model: Path) -> None:
    if not model.exists():
        raise UsageError(f"--model {model}: no such directory", found=str(model),
                         hint="give the directory of the model's config.json and weights "
                              "(a Hugging Face snapshot, or scripts/make_tiny_checkpoint.py's)")
    if not model.is_dir() or not (model / "config.json").is_file():
        raise UsageError(f"--model {model}: not a model directory (no config.json in it)",
                         found=str(model), hint="give the directory that holds the model's "
                                                "config.json and weights")


def _require_engine() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UsageError("kvspec profile measures a running vLLM, which is not installed "
                         "in this Python", expected="vLLM 0.32 (CPU) or 0.33 (GPU)",
                         hint="on a CPU: bash scripts/install-cpu-engine.sh VENV, then run "
                              "kvspec profile from that venv (docs/serving.md); on a GPU: "
                              "pip install 'kvspec[vllm]'")


@contextmanager
def _artifact(layout: Path, memory: str | None) -> Iterator[Path]:
    """The artifact the engine is held to: ``layout`` itself, or the source compiled
    (at ``memory``) into a temporary file."""
    # deferred: the compiler and the explain reports (pydantic) load when the command runs
    from kvspec.artifact import Artifact
    from kvspec.reports.explain import is_artifact_path

    if is_artifact_path(layout):
        if memory is not None:
            raise UsageError("--memory sizes a source; an artifact has its budget",
                             found=memory, hint="compile the source at that budget, or give "
                                                "the source itself")
        Artifact.read(layout)  # its errors here, positioned, before an engine starts
        yield layout
        return
    from kvspec.compiler import compile as compile_layout  # deferred: the compiler

    art = compile_layout(layout, memory=parse_bytes(memory) if memory else None)
    if art.body.budget is None:
        raise UsageError(f"{layout}: the source gives no memory budget",
                         hint="give --memory, the KV cache memory per rank (1GiB)")
    with tempfile.TemporaryDirectory(prefix="kvspec-profile-") as tmp:
        path = Path(tmp) / f"{art.name}.kvlayout.json"
        art.write(path)
        yield path


def _measure(artifact: Path, model: Path, grid: str, repeats: int | None,
             quiet: bool) -> dict[str, Any]:
    """Run the grid on the engine (a child process); its description and steps."""
    spec = {"artifact": str(artifact.resolve()), "model": str(model.resolve()), "grid": grid,
            "repeats": repeats}
    env = {**os.environ, "KVSPEC_LAYOUT": str(artifact.resolve()),
           "KVSPEC_MODE": PLUGIN_MODE, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    env.update(_layout_env(artifact))
    result: dict[str, Any] = {"steps": []}
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "kvspec.integrations.vllm.profile_engine", json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        try:
            _read_events(child, result, grid, quiet)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
        log.seek(0)
        tail = log.read()[-6000:]
    if "error" in result:
        raise _refusal(result["error"], artifact, model)
    if "describes" not in result or child.returncode != 0 or "done" not in result:
        raise KvspecError(f"the engine stopped before the grid was measured (exit "
                          f"{child.returncode})", found=_last_lines(tail),
                          hint="its log's last lines are above; check that the model "
                               "loads with vLLM on its own")
    return result


def _layout_env(artifact: Path) -> dict[str, str]:
    """The engine's environment variables the artifact's plan needs (its axis order,
    pipeline partition), as ``kvspec engine-args`` prints them."""
    # deferred: the artifact's flags (the compiler's model, pydantic) load when it runs
    from kvspec.artifact import Artifact
    from kvspec.integrations.vllm.engine_args import engine_args

    args = engine_args(Artifact.read(artifact), str(artifact), mode=PLUGIN_MODE)
    return {k: v for k, v in args.env.items() if not k.startswith("KVSPEC_")}


def _read_events(child: subprocess.Popen[str], result: dict[str, Any], grid: str,
                 quiet: bool) -> None:
    # deferred: the engine driver's module (the compiler's model, pydantic), when it runs
    from kvspec.integrations.vllm.profile_engine import TAG

    assert child.stdout is not None
    events = _events(child.stdout, TAG)  # one stream: the second loop goes on from the first
    with progress(None, label="starting the engine", quiet=quiet, notes=True,
                  delay=0) as start:
        for kind, event in events:
            if kind == "started":
                result.update(event)
                break
            if kind == "error":
                result["error"] = event
                return
            start.advance()
    if "describes" not in result:
        return
    total = len(result["scenarios"]) * result["repeats"]
    with progress(total, label=f"profiling ({grid} grid)", quiet=quiet, notes=True,
                  delay=0) as bar:
        for kind, event in events:
            if kind == "scenario":
                result["steps"] += event["steps"]
                bar.advance(event["name"])
            elif kind == "error":
                result["error"] = event
                return
            elif kind == "done":
                result["done"] = event


def _events(lines: Iterable[str], tag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The driver's events among the engine's output: lines that start with ``tag``,
    each ``(kind, fields)``."""
    for line in lines:
        if line.startswith(tag):
            event = json.loads(line[len(tag):])
            yield event.pop("event"), event


def _last_lines(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-_SHOWN:])


def _refusal(error: dict[str, Any], artifact: Path, model: Path) -> KvspecError:
    """The engine's refusal as a kvspec error: the plugin's drift message (which names
    each field and both values) when it is one."""
    message = str(error.get("message", ""))
    stage = error.get("stage")
    drift = next((m for m in message.split("\n") if "EngineDrift" in m or "PluginError" in m),
                 None)
    if drift is not None:
        text = message[message.index(drift):].split("\n\n")[0]
        first = text.split(": ", 1)[1] if ": " in text else text
        return KvspecError(f"the engine on {model} refused the layout {artifact}: "
                           + first.splitlines()[0].removeprefix("kvspec: "),
                           found="\n".join(first.splitlines()[1:_SHOWN]) or None,
                           hint="profile the model the layout was made for (kvspec init "
                                "--from-vllm MODEL makes its source), with the layout's "
                                "settings")
    if stage == "plugin":
        return KvspecError("kvspec's plugin did not load in the engine, so it did not run "
                           "the layout's plan", hint="install kvspec in the engine's "
                           "environment (its vllm.general_plugins entry point)")
    what = "failed to start" if stage == "start" else "failed while profiling"
    return KvspecError(f"the engine on {model} {what}", found=_last_lines(message),
                       hint="check that the model loads with vLLM on its own, with the "
                            "flags `kvspec engine-args` prints for the layout")


def _note(measured: dict[str, Any], trimmed: Any) -> str:
    """The provenance note: the grid, the steps, what a step's seconds time."""
    core = [s[5] / s[4] for s in measured["steps"] if len(s) > 5 and s[4] > 0]
    share = sum(core) / len(core) if core else 0.0
    unknown = measured.get("unknown_flags") or []
    left = f"; flags this vLLM does not take, left out: {' '.join(unknown)}" if unknown else ""
    return (f"{len(measured['scenarios'])} scenarios x {measured['repeats']} repeats, "
            f"{trimmed.steps} steps, {len(trimmed.kept) + len(trimmed.dropped)} batch shapes "
            f"(each at its fastest), {len(trimmed.dropped)} left out as interrupted; fitted "
            f"on relative error; a step is one LLMEngine.step() (engine core "
            f"{share:.0%} of it on average){left}")


#: ``kvspec profile``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "the profile was written"),
    (EXIT_INVALID, ("the layout does not load, the engine refused it (another model's "
                    "layout: the plugin's drift message), or the engine failed")),
    (EXIT_USAGE, USAGE + "; vLLM is not installed; --model is not a model directory"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("latency.md", "serving.md")
