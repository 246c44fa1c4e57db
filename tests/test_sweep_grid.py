"""The sweep's grid file before any point runs (issue 48): constraints bounded and
scanned once, numbers refused at their field, repeated and empty axes refused,
grids too large refused before a point is made, bases and traces placed at the
grid entry that names them, traces read in every format. The bad grids' messages
are goldens in ``tests/errors/sweep/`` (tests/test_sweep.py runs them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvspec.errors import KvspecError
from kvspec.sweep import parse_grid, plan_sweep
from kvspec.sweep.constraints import MAX_DEPTH, ConstraintError, parse_constraint
from kvspec.sweep.points import MAX_POINTS
from tests.conftest import ROOT

AXES = {"tensor", "pipeline", "memory"}
GRID = f"""\
kvspec_sweep: 1
base: {ROOT}/layouts/llama-3.1-8b.yaml
axes:
  tensor: [1, 2]
  workload: [{{name: chat, context_tokens: 512, output_tokens: 64, requests: 20}}]
target: {{rate: 20, step_ms: 30}}
"""


def _error(text: str, file: str = "/tmp/g.yaml") -> KvspecError:
    with pytest.raises(KvspecError) as exc:
        plan_sweep(parse_grid(text, file))
    return exc.value


@pytest.mark.parametrize("text", [
    "(" * 400 + "tensor" + ")" * 400 + " <= 1",
    "-" * 1000 + "tensor <= 1",
    " + ".join(["tensor"] * 1000) + " <= 2000",
    " * ".join(["tensor"] * 1000) + " >= 0",
    "1 < " + " < ".join(["tensor"] * 1000),
    " and ".join(["tensor <= 2"] * 600),
], ids=["parentheses", "minus", "sum", "product", "chain", "and"])
def test_deep_or_long_constraints_never_recurse(text: str) -> None:
    if text.startswith("("):  # only nesting past the bound is refused
        with pytest.raises(ConstraintError) as exc:
            parse_constraint(text, AXES)
        assert exc.value.message == f"parentheses nested more than {MAX_DEPTH} deep"
        assert exc.value.offset == MAX_DEPTH
        return
    parse_constraint(text, AXES).holds({"tensor": 2, "pipeline": 1, "memory": 1})


def test_a_thousand_minus_signs_and_terms_mean_what_they_say() -> None:
    assert parse_constraint("-" * 1000 + "tensor == 2", AXES).holds({"tensor": 2})
    assert parse_constraint("-" * 1001 + "tensor == -2", AXES).holds({"tensor": 2})
    assert parse_constraint(" + ".join(["tensor"] * 1000) + " == 2000", AXES).holds(
        {"tensor": 2})


def test_a_long_constraint_is_refused_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="a constraint of 1,800,000 characters"):
        parse_constraint("tensor + " * 200_000, AXES)
    # scanning is linear: the longest constraint read is read in milliseconds
    parse_constraint("+".join(["1"] * 4990) + " <= tensor", AXES)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("text, message", [
    ("memory <= 80G", "cannot read '80G' as a size"),
    ("memory <= 80 GiB", "unexpected 'GiB'"),
    ("tensor <= 2tensor", "cannot read '2tensor' as a number or a size"),
    ("tensor <= 1e999", "the number 1e999 is too large"),
    ("tensor <= " + "9" * 400, "is too large"),
    ("(tensor <= 2) + 1 <= 3", "'+' takes numbers, not a condition"),
    ("tensor and pipeline <= 1", "and joins comparisons"),
    ("", "the constraint is empty"),
])
def test_constraint_siblings_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ConstraintError, match=message.replace("(", r"\(").replace(
            ")", r"\)").replace("+", r"\+")):
        parse_constraint(text, AXES)


def test_conditions_group_in_parentheses() -> None:
    c = parse_constraint("(tensor == 1 or pipeline == 1) and memory >= 1GiB", AXES)
    assert c.holds({"tensor": 1, "pipeline": 2, "memory": 2**30})
    assert not c.holds({"tensor": 2, "pipeline": 2, "memory": 2**30})


@pytest.mark.parametrize("edit, where, words", [
    (("rate: 20", "rate: .inf"), "target.rate", "a finite number"),
    (("rate: 20", "rate: 1.0e+300"), "target.rate", "at most 1,000,000,000"),
    (("step_ms: 30", "step_ms: .nan"), "target.step_ms", "a finite number"),
    (("step_ms: 30", "step_ms: {1: .inf, 2: 30}"), "target.step_ms[1]", "a finite number"),
    (("step_ms: 30", "step_ms: 5.0e-324"), "target.step_ms", "0.001 or more"),
    (("tensor: [1, 2]", "memory: [0]"), "axes.memory[0]", "more than 0 bytes"),
    (("tensor: [1, 2]", "tensor: [1e1]"), "axes.tensor[0]", "write 10"),
    (("requests: 20", "requests: 20, rate: .inf"), "axes.workload[0].rate", "finite"),
    (("requests: 20", "requests: 20, prefix_sharing: .nan"),
     "axes.workload[0].prefix_sharing", "finite"),
    (("requests: 20", "requests: 20, seed: 99999999999999999999999"),
     "axes.workload[0].seed", "below"),
    (("target: {", "gpu_memory_utilization: .nan\ntarget: {"), "gpu_memory_utilization",
     "finite"),
    (("rate: 20", "rate: 1" + "0" * 400), "target.rate", "a finite number"),
    # too small to be meant: 1e-300 requests/s, given as a number or with its unit
    (("rate: 20", "rate: 1.0e-300"), "target.rate", "1e-06 or more"),
    (("rate: 20", "rate: '1e-300 requests/s'"), "target.rate", "1e-06 or more"),
    (("requests: 20", "requests: 20, rate: 1.0e-300"), "axes.workload[0].rate",
     "1e-06 or more"),
])
def test_numbers_are_refused_at_their_field(edit: tuple[str, str], where: str,
                                            words: str) -> None:
    err = _error(GRID.replace(*edit))
    text = err.render()
    assert f"at: {where}" in text and words in text, text
    assert err.line is not None and err.file == "/tmp/g.yaml"
    for leak in ("constrained", "finite_number", "float_parsing", "Input should", "dict["):
        assert leak not in text, text


@pytest.mark.parametrize("axis, values", [
    ("tensor", "[1, 2, 1]"), ("pipeline", "[1, 1]"), ("memory", "[1GiB, 1073741824]"),
    ("block_size", "[16, 16]"), ("max_num_seqs", "[8, 8]"), ("kv_cache_dtype", "[fp8, fp8]"),
    ("pooling.policy", "[auto, auto]")])
def test_a_repeated_axis_value_is_an_error_at_the_repeat(axis: str, values: str) -> None:
    err = _error(GRID.replace("tensor: [1, 2]", f"{axis}: {values}"))
    assert "is given twice" in err.message and err.path == f"axes.{axis}[{values.count(',')}]"
    assert f"the first is axes.{axis}[0]" in (err.hint or "")


@pytest.mark.parametrize("axis", ["tensor", "memory", "pooling.policy", "workload"])
def test_an_axis_with_no_value_is_an_error(axis: str) -> None:
    text = GRID.replace("tensor: [1, 2]", f"{axis}:") if axis != "workload" else \
        GRID.replace("  workload: [", "  workload:\n  x: [")
    err = _error(text)
    if axis != "workload":
        assert err.message == f"the axis {axis!r} has no values"


def test_a_repeated_workload_is_an_error() -> None:
    w = "{name: %s, context_tokens: 512, output_tokens: 64, requests: 20}"
    err = _error(GRID.replace("workload: [" + w % "chat", "workload: [" + w % "a" + ", " +
                              w % "b"))
    assert err.message == "workload 'b' is workload 'a' again: the same requests"


def test_a_huge_grid_is_refused_before_a_point_is_made() -> None:
    values = ", ".join(str(2**30 + i) for i in range(1000))
    text = GRID.replace("tensor: [1, 2]", f"memory: [{values}]\n  max_num_seqs: "
                        f"[{', '.join(str(i) for i in range(1, 1001))}]")
    start = time.monotonic()
    err = _error(text)
    assert time.monotonic() - start < 5
    assert err.message == (f"the grid has 1,000,000 points, more than a sweep runs "
                           f"({MAX_POINTS:,})")
    assert err.found == "base 1 x memory 1,000 x max_num_seqs 1,000 x workload 1"
    with_constraint = text.replace("target:", "constraints: ['max_num_seqs <= 2']\ntarget:")
    # the constraints leave 2,000 points: planned (their sources checked) in seconds
    assert len(plan_sweep(parse_grid(with_constraint, "/tmp/g.yaml")).points) == 2000


def test_bases_and_traces_are_placed_at_the_grid(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    (tmp_path / "d").mkdir()
    for written, message in [("missing.yaml", "no such file: missing.yaml"),
                             ("d", "d is a directory, not a layout source"),
                             ("{hf: missing.json}", "no such file: missing.json")]:
        err = _error(GRID.replace(f"{ROOT}/layouts/llama-3.1-8b.yaml", written), str(grid))
        assert (err.file, err.line, err.message) == (str(grid), 2, message)
    err = _error(GRID.replace("{name: chat, context_tokens: 512, output_tokens: 64, "
                              "requests: 20}", "{trace: gone.csv}"), str(grid))
    assert (err.file, err.line, err.path) == (str(grid), 5, "axes.workload[0].trace")


@pytest.mark.parametrize("trace, extra", [
    ("azure-2023.csv", ""), ("azure-2024.csv", ""), ("burstgpt.csv", ", step_ms: 50"),
    ("mooncake.jsonl", ""),
    ("lengths.csv", ", format: lengths, columns: {prompt: input_len, output: output_len}")])
def test_a_trace_workload_reads_every_format_simulate_does(trace: str, extra: str) -> None:
    from kvspec.sim.formats import read_requests

    text = GRID.replace("{name: chat, context_tokens: 512, output_tokens: 64, requests: 20}",
                        f"{{trace: {ROOT}/tests/data/traces/{trace}{extra}}}")
    sweep = plan_sweep(parse_grid(text, "/tmp/g.yaml"))
    requests = next(iter(sweep.traces.values()))
    assert len(sweep.points) == 2 and len(requests) > 0
    if not extra:
        assert requests == read_requests(ROOT / "tests/data/traces" / trace)


def test_a_boolean_version_is_refused() -> None:
    # YAML's true is Python's 1: it passed as format version 1
    err = _error(GRID.replace("kvspec_sweep: 1", "kvspec_sweep: true"))
    assert "at: kvspec_sweep" in err.render() and err.line == 1, err.render()


def test_an_unknown_init_target_is_refused_at_its_line(tmp_path: Path) -> None:
    config = ROOT / "tests" / "data" / "sweep" / "llama-3.1-70b.json"
    text = GRID.replace(f"base: {ROOT}/layouts/llama-3.1-8b.yaml",
                        f"base:\n  - hf: {config}\n    target: bogus")
    err = _error(text)
    rendered = err.render()
    assert err.line == 4 and "at: base[0].target" in rendered, rendered
    assert "hopper" in rendered, rendered


def test_a_step_time_with_no_value_is_placed_at_its_key() -> None:
    # `step_ms:` with nothing after it was reported at `target:`, a line above
    err = _error(GRID.replace("target: {rate: 20, step_ms: 30}",
                              "target:\n  rate: 20\n  step_ms:"))
    assert err.line == 8 and "at: target.step_ms" in err.render(), err.render()
