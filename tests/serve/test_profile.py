"""``kvspec profile`` on the CPU engine (issue 49, item 3): vLLM held to the tiny
Llama's artifact by the plugin (verify) runs the quick grid once, and the profile it
writes is one ``kvspec simulate --profile`` takes for that layout. No timing is
asserted: the checks are of the mechanism (what the profile describes, its
coefficients, its residuals), never of how fast this machine is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.serve.conftest import CACHE, artifact, checkpoint, kvspec

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def profiled() -> tuple[Path, Path, Path]:
    """(artifact, checkpoint, profile): the quick grid, once."""
    art = artifact("llama")
    out = CACHE / "profile" / "llama.profile.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    kvspec("profile", str(art), "--model", str(checkpoint("llama")), "--repeats", "1",
           "-o", str(out))
    return art, checkpoint("llama"), out


def test_the_profile_describes_the_deployment_it_measured(
        profiled: tuple[Path, Path, Path]) -> None:
    from kvspec.artifact import Artifact
    from kvspec.source.profile import read_profile

    art, _, path = profiled
    profile = read_profile(str(path))  # validates, at every field's position
    body = Artifact.read(art).body
    d = profile.model.describes
    assert (d.engine, d.engine_version) == ("vllm", "0.32.0")
    assert d.model == body.model
    assert (d.tensor_parallel_size, d.pipeline_parallel_size) == (1, 1)
    assert (d.dtype, d.kv_cache_dtype) == ("bfloat16", body.engine.kv_cache_dtype)
    assert d.device.endswith("(CPU)")
    assert profile.model.provenance.method == "measured"
    assert profile.model.provenance.command.startswith("kvspec profile ")


def test_its_coefficients_are_non_negative_and_its_residuals_reported(
        profiled: tuple[Path, Path, Path]) -> None:
    from kvspec.source.profile import read_profile

    profile = read_profile(str(profiled[2])).model
    st = profile.step_time
    coefficients = (st.fixed, st.prefill_tokens, st.decode_requests, st.context_tokens,
                    st.prefill_pairs)
    assert all(c >= 0 for c in coefficients) and any(c > 0 for c in coefficients)
    assert profile.fit is not None and profile.fit.samples >= 20
    assert profile.fit.rms_residual > 0 and profile.fit.max_residual >= profile.fit.rms_residual
    assert profile.fit.max_relative_error is not None
    assert profile.fit.max_relative_error >= profile.fit.mean_relative_error
    rng = profile.measured_range
    assert rng is not None
    # the grid's decode batches reach 64 requests, its prefills 768 tokens at once
    assert rng.decode_requests[1] >= 64 and rng.prefill_tokens[1] >= 768


def test_simulate_takes_the_profile_for_that_layout(profiled: tuple[Path, Path, Path]
                                                    ) -> None:
    art, _, path = profiled
    trace = CACHE / "profile" / "short.trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.05, "prompt_tokens": 200,
                                         "output_tokens": 16}) + "\n" for i in range(20)))
    done = kvspec("simulate", str(art), "--workload", str(trace), "--profile", str(path),
                  "--format", "json", "-q")
    latency = json.loads(done.stdout)["kvspec"]["latency"]
    assert latency["ttft_s"]["p50"] > 0 and latency["requests_per_s"] > 0


def test_another_models_layout_is_refused_with_the_plugins_message(tmp_path: Path) -> None:
    done = kvspec("profile", str(artifact("gemma2")), "--model", str(checkpoint("llama")),
                  "-o", str(tmp_path / "x.profile.yaml"), check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "refused the layout" in done.stderr and "SlidingWindowSpec" in done.stderr
    assert "Traceback" not in done.stderr.split("kvspec: error:", 1)[1]
    assert not (tmp_path / "x.profile.yaml").exists()
