"""Fuzz test (issue 15): for any mutated source, dump or Hugging Face config,
``kvspec validate`` / ``kvspec import`` / ``kvspec init --from-hf`` succeed (and
a source ``init`` writes compiles) or refuse cleanly -- exit 1 or 2, every message
starting ``FILE:LINE:COL: error:`` where the input has a position (``FILE:
error:`` otherwise) with a ``hint:`` line, no traceback;
for any generated valid source that compiles, block ids never share bytes (at
several block counts), every invariant holds, the artifact reads back, and it
loads on ``meta`` at its smallest block count and larger ones; for any edited
artifact, ``kvspec explain`` reads or refuses it cleanly, and reading its text
gives the verdict ``verified`` gives of json's parse.

Bounded to well under a minute on two cores (about 30 s here): fixed example
counts (``KVSPEC_FUZZ_SOURCES``, ``_DUMPS``, ``_CONFIGS``, ``_ARTIFACTS``, ``_VALID``
change them), derandomized and without an example database, so CI runs the same
cases every time; a 10 s limit per case; small inputs only (the 1 MB ones are in
``benchmarks/fuzz.py``, which runs tens of thousands of cases and minimises a reproducer of every
defect). Every defect class it found is fixed; ``FIXED`` keeps each one's
minimal reproducer, and a test checks that each now fails cleanly. ``KNOWN``
lists defect classes found but not fixed yet (none now): the property tests
tolerate exactly those, and ``KVSPEC_FUZZ_STRICT=1`` makes them tolerate none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.artifacts import check_artifact, mutated_artifacts
from tests.fuzz.generators import (
    Outcome,
    check_args,
    check_cli,
    check_init,
    check_valid,
    command_lines,
    mutated_configs,
    mutated_dumps,
    mutated_sources,
    valid_sources,
)
from tests.test_properties import sources as property_sources

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
#: Seconds any one case may take (well above what a small input needs).
CASE_LIMIT = 10.0


_LAYER = ('"name": "model.layers.0.attn", "kind": "full_attention", "num_kv_heads": 1, '
          '"head_size": 64, "dtype": "bfloat16"')
_CONFIG = '"config": {"block_size": 16, "max_model_len": 64}'
_BAD_HEADS = ('"layers": [{"name": "model.layers.0.attn", "kind": "full_attention", '
              '"num_kv_heads": "x", "head_size": 64, "dtype": "bfloat16"}]')


def _dump_layer(field: str) -> bytes:
    """A one-layer dump whose layer has ``field`` besides the usual ones."""
    return ("{" + _CONFIG + ', "layers": [{' + _LAYER + ", " + field + "}]}").encode()


def _tps_source(value: str) -> str:
    return ("kvspec: 1\nname: x\nengine: {max_model_len: 64}\n"
            "defaults: {num_kv_heads: 1, head_size: 64, dtype: bfloat16}\nlayer_types:\n"
            f"  full: {{kind: full_attention, tokens_per_state: '{value}'}}\n"
            "  swa: {kind: sliding_window, sliding_window: 16}\n"
            "layers:\n  - {pattern: [full, swa]}\n")


@dataclass(frozen=True)
class Reproducer:
    """A defect class benchmarks/fuzz.py found, and its minimal input."""

    id: str
    #: the start of the defect's signature (tests/fuzz/generators.py: Outcome)
    signature: str
    command: str
    suffix: str
    data: bytes
    what: str


#: Defect classes ``benchmarks/fuzz.py`` found (issue 15) and that are fixed:
#: ``test_a_fixed_defect_stays_fixed`` runs each reproducer and wants a clean
#: outcome (success or a clear error), no defect of any kind.
FIXED: tuple[Reproducer, ...] = (
    Reproducer("dump-json-recursion", "RecursionError | read.py:load_dump", "import", ".json",
          b"[" * 5000 + b"]" * 5000,
          "a dump nested ~1000 levels deep: RecursionError from json.loads"),
    Reproducer("dump-json-digits", "traceback | ValueError at read.py:load_dump", "import", ".json",
          b'{"config": {"block_size": 1' + b"0" * 5000 + b"}}",
          "a number of more than 4300 digits in a dump: ValueError from json.loads"),
    Reproducer("dump-layer-no-heads", "traceback | KeyError at importer.py", "import", ".json",
          ("{" + _CONFIG + ', "layers": [{"name": "model.layers.0.attn", '
           '"kind": "full_attention"}]}').encode(),
          "a dump attention layer without num_kv_heads/head_size/dtype: KeyError"),
    Reproducer("dump-tokens-per-state-x", "traceback | ValueError at specs.py:tokens_per_state",
          "import", ".json",
          _dump_layer('"tokens_per_state": "x"'),
          "tokens_per_state \"x\" in a dump: ValueError from Fraction"),
    Reproducer("dump-tokens-per-state-1/0",
          "traceback | ZeroDivisionError at specs.py:tokens_per_state", "import", ".json",
          _dump_layer('"tokens_per_state": "1/0"'),
          "tokens_per_state \"1/0\" in a dump: ZeroDivisionError"),
    Reproducer("source-tokens-per-state-x", "traceback | ValueError at specs.py:tokens_per_state",
          "validate", ".yaml", _tps_source("x").encode(),
          "tokens_per_state 'x' in a source: ValueError from Fraction"),
    # a 0-byte page; where the division by it fails moves as the planner changes
    Reproducer("source-tokens-per-state-1e3", "traceback | ZeroDivisionError",
          "validate", ".yaml", _tps_source("1e3").encode(),
          "tokens_per_state '1e3' beside a sliding-window layer: ZeroDivisionError "
          "(a 0-byte page)"),
    Reproducer("dump-json-error-no-hint", "message quality: no hint | not valid JSON",
          "import", ".json", b"{",
          "'not valid JSON: ...' has neither expected: nor hint:"),
    Reproducer("dump-duplicate-key-no-position",
          "message quality: no line:col | the input has a key twice", "import", ".json",
          ('{"config": {"block_size": 16, "block_size": 16, "max_model_len": 64},\n '
           + _BAD_HEADS + "}\n").encode(),
          "a key twice anywhere in a dump: every error of the dump loses its line:col"),
    Reproducer("dump-deep-no-position",
          "message quality: no line:col | the input nests more than 64 levels", "import",
          ".json", ('{"facts": ' + "[" * 65 + "]" * 65 + ",\n " + _CONFIG + ",\n "
                    + _BAD_HEADS + "}\n").encode(),
          "more than 64 levels anywhere in a dump: every error loses its line:col"),
    Reproducer("source-draft-block-no-hint",
          "message quality: no hint | draft block size", "validate", ".yaml",
          (Path(__file__).parent / "errors" / "draft-block-size.yaml").read_bytes(),
          "'draft block size N must be a positive multiple of 64 ...' has no hint"),
    Reproducer("source-merge-key-no-hint",
          "message quality: no hint | a merge key (<<) needs a mapping",
          "validate", ".yaml", b"kvspec: 1\nname: x\nengine: {<<: 5, max_model_len: 64}\n",
          "'a merge key (<<) needs a mapping' has neither expected: nor hint:"),
    Reproducer("source-mla-pages-empty-no-hint",
          "message quality: no hint | MLA layers differ in page size", "validate",
          ".yaml", b"kvspec: 1\nname: x\nengine: {max_model_len: 128}\nlayer_types:\n"
          b"  idx: {kind: mla, num_kv_heads: 1, head_size: 576, dtype: bfloat16, "
          b"tokens_per_state: 4}\n"
          b"  m: {kind: mamba, shapes: [[8]], dtypes: [float32]}\n"
          b"layers:\n  - {pattern: [idx, m]}\n",
          "only compressed MLA (tokens_per_state > 1) beside state layers: 'MLA layers "
          "differ in page size []', an empty list and no hint"),
    Reproducer("source-raw-u2028", "message quality: raw control character | '\\u2028'",
          "validate", ".yaml", b'{"\\u2028": 1}\n',
          "a key with U+2028 is printed raw on the at: line (a line break on a terminal)"),
    Reproducer("source-raw-u2029", "message quality: raw control character | '\\u2029'",
          "validate", ".yaml",
          b'kvspec: 1\nname: x\nengine: {max_model_len: 64, "a\\u2029": 1}\n',
          "a key with U+2029 is printed raw on the at: line"),
    # kvspec init --from-hf: benchmarks/fuzz.py --configs 4000 --seed 5 at e36bec1
    Reproducer("config-architectures-bool", "traceback | TypeError at __init__.py:family_of",
               "init", ".json", b'{"architectures":true}', "architectures not a list"),
    Reproducer("config-architectures-int", "traceback | TypeError at facts.py:architecture",
               "init", ".json", b'{"architectures":8,"model_type": "mixtral" }',
               "architectures an integer, with a family known by model_type"),
    Reproducer("config-architectures-object", "traceback | KeyError at facts.py:architecture",
               "init", ".json", b'{"architectures":{"":""},  "model_type": "mistral" }',
               "architectures an object"),
    Reproducer("config-architectures-nested", "traceback | AttributeError at init.py:<genexpr>",
               "init", ".json", b'{"architectures":[[]],  "model_type": "gemma3",  '
               b'"text_config": {   "num_hidden_layers": 62  } }',
               "an architectures entry that is not a string (a multimodal family)"),
    Reproducer("config-mtp-string", "traceback | ValueError at init.py:source_data", "init",
               ".json", b'{  "hidden_size": 5120,  "model_type": "mistral",  '
               b'"num_attention_heads": 32,  "num_hidden_layers": 40,  '
               b'"num_nextn_predict_layers": "X" }',
               "num_nextn_predict_layers a string: int() of it"),
    Reproducer("config-mtp-list", "traceback | TypeError at init.py:source_data", "init",
               ".json", b'{  "hidden_size": 84,  "model_type": "qwen2",  '
               b'"num_attention_heads": 28,  "num_hidden_layers": 28,  '
               b'"num_nextn_predict_layers": [ ""  ] }', "num_nextn_predict_layers a list"),
    Reproducer("config-mtp-infinity", "traceback | OverflowError at init.py:source_data",
               "init", ".json", b'{"hidden_size": 3584, "model_type": "qwen2", '
               b'"num_attention_heads": 28, "num_hidden_layers": 28, '
               b'"mtp_num_hidden_layers": Infinity}', "mtp_num_hidden_layers Infinity"),
    Reproducer("config-zero-heads", "traceback | ZeroDivisionError at facts.py:head_dim_of",
               "init", ".json", b'{"hidden_size":4,"model_type":"qwen2",  '
               b'"num_attention_heads": 0,  "num_hidden_layers": 28 }',
               "num_attention_heads 0 and no head_dim"),
    Reproducer("config-billion-layers", "timeout", "init", ".json",
               b'{"model_type": "llama", "num_hidden_layers": 1000000000, "hidden_size": 512, '
               b'"num_attention_heads": 8, "max_position_embeddings": 64}',
               "num_hidden_layers of a billion: a billion layer facts built"),
    Reproducer("config-long-integer", "traceback | ValueError at files.py:read_json", "init",
               ".json", b"9" * 4400, "an integer of more than 4,300 digits: json.loads' "
               "ValueError"),
    Reproducer("config-deep", "message quality: no line:col | not valid JSON", "init",
               ".json", b"[" * 5000 + b"]" * 5000,
               "nested deeper than json recurses: no line:col"),
    Reproducer("config-unreadable-no-hint", "message quality: no hint | cannot read",
               "init", ".json", b'{"model_type":"gemma3"}',
               "'cannot read the model from config.json: ...' has no hint"),
    Reproducer("config-not-an-object-no-hint",
               "message quality: no hint | config.json must hold a JSON object", "init",
               ".json", b"0", "a config that is a number: no hint"),
    Reproducer("config-empty-no-hint", "message quality: no hint | not valid JSON", "init",
               ".json", b"", "an empty config: no hint"),
    # command lines: benchmarks/fuzz.py --args 6000 --seed 4 at 3f2dd9f, and by hand
    Reproducer("args-compile-empty-path",
               "traceback | ValueError at common.py:default_artifact_path", "args", "",
               b"compile\0", "`kvspec compile ''`: PosixPath('.') has an empty name"),
    Reproducer("args-compile-root", "traceback | ValueError at common.py:default_artifact_path",
               "args", "", b"compile\0/", "`kvspec compile /`"),
    Reproducer("args-output-glob", "traceback | ValueError at files.py:_clean_stale", "args",
               "", b"explain\0-o\0" + b"2**40\0a.kvlayout.json",
               "an output file named 2**40: its stale temporaries were found by glob"),
    Reproducer("args-check-missing-no-hint",
               "message quality: no hint | no such file or directory", "args", "",
               b"check\0nonexist", "`kvspec check nonexist` had no hint"),
    Reproducer("args-check-neither-no-hint", "message quality: no hint | config.json is "
               "neither", "args", "", b"check\0config.json",
               "`kvspec check config.json` had no hint"),
    Reproducer("args-max-model-len-no-hint",
               "message quality: no hint | --max-model-len", "args", "",
               b"init\0--from-hf\0config.json\0--max-model-len\0-1",
               "`--max-model-len -1` had no hint"),
    Reproducer("dump-json-infinity", "message quality: no line:col | invalid value for",
               "import", ".json",
               ('{"config": {"block_size": 16, "max_model_len": 64,\n "kv_cache_layout": '
                'Infinity},\n ' + _BAD_HEADS + "}\n").encode(),
               "NaN/Infinity (read by Python's json, not JSON): every error loses its "
               "line:col"),
)
#: Defect classes found and not fixed yet, each with its reproducer: the property
#: tests tolerate exactly these signatures and fail on any other.
KNOWN: tuple[Reproducer, ...] = ()
STRICT = os.environ.get("KVSPEC_FUZZ_STRICT") == "1"


def _new_defects(out: Outcome) -> list[str]:
    """The defects of ``out`` that are not a known class."""
    return [d for d, sig in zip(out.details, out.signatures)
            if STRICT or not any(sig.startswith(k.signature) for k in KNOWN)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _explain(out: Outcome, what: str, data: bytes) -> str:
    shown = data if len(data) <= 1500 else data[:1500] + b"..."
    lines = [f"{what}: {len(data)} bytes"] + [
        f"  {c}: {d}" for c, d in zip(out.defects, out.details)]
    return "\n".join(lines) + "\ninput:\n" + shown.decode("utf-8", "backslashreplace")


def _run(workdir: Path, name: str, data: bytes, args: list[str], kind: str) -> Outcome:
    path = workdir / name
    path.write_bytes(data)
    return check_cli([*args, str(path)], str(path), data, seconds=CASE_LIMIT, kind=kind)


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_SOURCES", "1500")))
@given(mutated_sources())
def test_a_mutated_source_validates_or_fails_clearly(workdir: Path, case: tuple) -> None:
    seed, data, ops = case
    out = _run(workdir, "case.yaml", data, ["validate"], "yaml")
    assert not _new_defects(out), _explain(out, f"{seed} after {ops}", data)


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_CONFIGS", "300")))
@given(mutated_configs())
def test_a_mutated_config_inits_or_fails_clearly(workdir: Path, case: tuple) -> None:
    seed, data, ops = case
    path = workdir / "config.json"
    path.write_bytes(data)
    out = check_init(str(path), data, seconds=CASE_LIMIT)
    assert not _new_defects(out), _explain(out, f"{seed} after {ops}", data)


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_ARGS", "300")))
@given(command_lines())
def test_a_command_line_runs_or_fails_clearly(workdir: Path, args: list[str]) -> None:
    out = check_args(args, str(workdir), seconds=CASE_LIMIT)
    assert not _new_defects(out), _explain(out, f"kvspec {args}", b"")


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_DUMPS", "400")))
@given(mutated_dumps())
def test_a_mutated_dump_imports_or_fails_clearly(workdir: Path, case: tuple) -> None:
    seed, data, ops = case
    out = _run(workdir, "case.json", data, ["import"], "json")
    assert not _new_defects(out), _explain(out, f"{seed} after {ops}", data)


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_ARTIFACTS", "150")))
@given(mutated_artifacts())
def test_a_mutated_artifact_reads_or_fails_clearly(workdir: Path, case: tuple) -> None:
    """An edited artifact (hash recomputed or not): ``kvspec explain`` reads it or
    refuses it clearly, and the text reader (orjson first) and ``verified`` of
    json's parse give the same verdict."""
    seed, data, ops = case
    path = workdir / "case.kvlayout.json"
    path.write_bytes(data)
    out = check_artifact(data, str(path), seconds=CASE_LIMIT)
    assert not _new_defects(out), _explain(out, f"{seed} after {ops}", data)


def _sound(text: str, what: str) -> None:
    out = check_valid(text, "fuzz.yaml", seconds=CASE_LIMIT)
    assert not _new_defects(out), _explain(out, what, text.encode())


@settings(FUZZ, max_examples=int(os.environ.get("KVSPEC_FUZZ_VALID", "600")))
@given(valid_sources())
def test_a_generated_source_that_compiles_is_sound_and_loads(case: tuple) -> None:
    """Every axis order, layer kind, quantization mode, drafter, parallelism."""
    text, meta = case
    _sound(text, f"generated {meta}")


@settings(FUZZ, max_examples=100)
@given(property_sources())
def test_the_property_sources_are_sound_and_load(text: str) -> None:
    """tests/test_properties.py's generator, through the same checks."""
    _sound(text, "a tests/test_properties.py source")


@pytest.mark.parametrize("fixed", [pytest.param(k, id=k.id) for k in FIXED])
def test_a_fixed_defect_stays_fixed(workdir: Path, fixed: Reproducer) -> None:
    if fixed.command == "args":
        out = check_args(fixed.data.decode().split("\0"), str(workdir), seconds=CASE_LIMIT)
    elif fixed.command == "init":
        path = workdir / "fixed-config.json"
        path.write_bytes(fixed.data)
        out = check_init(str(path), fixed.data, seconds=CASE_LIMIT)
    else:
        out = _run(workdir, f"fixed{fixed.suffix}", fixed.data, [fixed.command],
                   "json" if fixed.suffix == ".json" else "yaml")
    assert not out.defects, _explain(out, f"{fixed.id} ({fixed.what})", fixed.data)
    assert out.exit_code in (0, 1, 2)
