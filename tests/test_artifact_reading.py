"""Reading artifacts from untrusted bytes (docs/artifact.md, "The trust model").

``Artifact.read`` (what ``load`` runs) checks the format, the hash and the
structure; ``kvspec.compiled.verified`` (what ``check``, ``verify``, ``explain``
and ``diff`` run) also re-plans. Every edit is refused with a positioned error,
or is exactly what kvspec plans; and whatever reading accepts is memory-safe,
which a brute-force oracle over every byte confirms.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

import kvspec
from kvspec.artifact import Artifact
from kvspec.artifact.blocks import memory_problems
from kvspec.artifact.format import Envelope
from kvspec.artifact.read import RECOMPILE
from kvspec.artifact.structure import shape_problems
from kvspec.artifact.text import canonical, sha256_of
from kvspec.compiled import verified
from kvspec.errors import ArtifactError
from tests.artifact_oracle import memory_unsafe, untrusted_fields
from tests.conftest import ROOT, invoke

TAMPER_SOURCES = ["tests/data/runtime/tiny.yaml", "layouts/example-hidden-state.yaml",
                  "layouts/example-mamba-cache-all.yaml"]
#: Layouts whose geometry the memory-safety property is checked on (every axis
#: order family, aliasing, packing, a drafter's own pool).
SAFETY_SOURCES = ["layouts/gemma-2-9b-it.yaml", "layouts/jamba-v0.1.yaml",
                  "layouts/example-packed-blhnc.yaml", "layouts/example-glm5-next-drafter.yaml",
                  "layouts/gpt-oss-20b.yaml", "layouts/example-mla-swa-fallback.yaml"]
FORMAT2 = sorted((ROOT / "tests" / "data" / "format2").glob("*.kvlayout.json"))
FORMAT2_REFUSED = "this artifact is format kvspec.layout/2; this kvspec reads kvspec.layout/3 only"


def resign(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the sha256 of its edited rest, as an editor covering its tracks would."""
    rest = {k: v for k, v in data.items() if k != "sha256"}
    return {**rest, "sha256": sha256_of(canonical(rest))}


def _leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, path + (k,))] + [path]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _leaves(v, path + (i,))] + [path]
    return [path]


def _mutations(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value, None]
    if isinstance(value, int):
        return [0, value + 1, -1, str(value), None]
    if isinstance(value, str):
        return ["", value + "x", 0]
    if isinstance(value, list):
        return [[], value[:-1], {}]
    if isinstance(value, dict):
        return [{}, []]
    return [0]


def _set(data: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _variants(data: dict) -> list[tuple[str, dict]]:
    out = []
    for path in _leaves(data["body"]):
        if not path:
            continue
        value = data["body"]
        for key in path:
            value = value[key]
        for new in _mutations(value):
            edited = copy.deepcopy(data)
            _set(edited["body"], path, new)
            out.append(("body." + ".".join(map(str, path)) + f"={new!r}", edited))
    for key in ("compiler", "source_sha256", "format"):
        edited = copy.deepcopy(data)
        edited[key] = "0" * 64 if key == "source_sha256" else "kvspec 9.9"
        out.append((key, edited))
        removed = copy.deepcopy(data)
        del removed[key]
        out.append((f"no {key}", removed))
    return out


@pytest.mark.parametrize("source", TAMPER_SOURCES, ids=lambda s: Path(s).stem)
def test_an_edited_artifact_is_refused_or_is_what_kvspec_compiles(source: str) -> None:
    """Every one-field edit of the body, the hash recomputed, is refused with an
    ArtifactError or describes exactly the plan kvspec makes of its own inputs
    (e.g. a changed max_num_seqs); nothing else is raised."""
    data = json.loads(kvspec.compile(ROOT / source).text())
    refused = accepted = 0
    for name, edited in _variants(data):
        text = json.dumps(resign(edited), indent=1)
        try:
            art = verified(text, "x.kvlayout.json")
        except ArtifactError as err:  # refused: either verdict is right, each is checked
            assert err.file == "x.kvlayout.json", name  # noqa: PT017
            assert err.hint, name  # noqa: PT017
            refused += 1
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{name}: {type(exc).__name__}: {exc}")
        assert canonical(kvspec.compiled.body_of(art.layout)) == canonical(art.body), name
        accepted += 1
    assert refused > 5 * max(accepted, 1), (refused, accepted)


@pytest.mark.parametrize("source", TAMPER_SOURCES, ids=lambda s: Path(s).stem)
def test_reading_text_and_reading_data_agree(source: str) -> None:
    """``from_text`` and ``from_dict`` give the same verdict on every 10th edit;
    whitespace and key order of the file are not part of what is checked."""
    art = kvspec.compile(ROOT / source)
    data = json.loads(art.text())
    assert Artifact.from_text(json.dumps(data, indent=4)).text() == art.text()
    for name, edited in _variants(data)[::10]:
        verdicts = []
        for read in (lambda e=edited: Artifact.from_text(json.dumps(resign(e)), origin="x"),
                     lambda e=edited: Artifact.from_dict(copy.deepcopy(resign(e)), origin="x")):
            try:
                read()
                verdicts.append("accepted")
            except ArtifactError as err:
                verdicts.append(err.message)
        assert verdicts[0] == verdicts[1], name


def _geometry_edit(rng: random.Random, data: dict) -> str:
    """One random change to a byte quantity the views rest on."""
    st = rng.choice(data["body"]["stages"])
    t = rng.choice(st["tensors"])
    field = rng.choice(["layer_stride", "block_stride", "offset", "view.head_stride",
                        "view.state_stride", "view.heads", "view.states", "view.cell_bytes",
                        "pool.offset", "pool.bytes_per_block", "allocation.size"])
    delta = rng.choice([-1, 1, -2, 2, -16, 16, -1024, 1024, -65536, 65536])

    def bump(v: Any) -> Any:
        if isinstance(v, dict):
            v = dict(v)
            key = rng.choice(["per_block", "fixed"])
            v[key] = max(0, v[key] + delta)
            return v
        return max(1, v + delta)

    if field.startswith("view."):
        t["view"][field[5:]] = bump(t["view"][field[5:]])
    elif field.startswith("pool."):
        pool = rng.choice(st["pools"])
        pool[field[5:]] = bump(pool[field[5:]])
    elif field == "allocation.size":
        a = rng.choice(st["allocations"])
        a["size"] = bump(a["size"])
    else:
        t[field] = bump(t[field])
    return field


@pytest.mark.parametrize("source", SAFETY_SOURCES, ids=lambda s: Path(s).stem)
def test_what_the_structure_checks_accept_is_memory_safe(source: str) -> None:
    """The trust model's promise: an edit of the geometry (hash recomputed) that
    the structure checks accept at a block count lays out no byte twice at that
    count. 150 seeded edits per layout, each judged against the brute-force
    oracle at 2 and 3 blocks per pool; the checks also accept every unedited plan."""
    base = msgspec.to_builtins(kvspec.compile(ROOT / source).envelope)
    rng = random.Random(source)
    caught = 0
    for _ in range(150):
        data = copy.deepcopy(base)
        field = _geometry_edit(rng, data)
        try:
            body = msgspec.convert(data, Envelope).body
        except msgspec.ValidationError:
            continue
        shape = shape_problems(body)
        for stage in range(len(body.stages)):
            for n in (2, 3):
                accepted = not shape and not memory_problems(body, stage, n)
                unsafe = memory_unsafe(body, stage, n)
                assert not (accepted and unsafe), (field, stage, n, unsafe)
                caught += bool(unsafe)
    assert caught > 20  # the edits do break layouts, and each one was caught
    for stage in range(len(base["body"]["stages"])):
        body = msgspec.convert(base, Envelope).body
        assert memory_unsafe(body, stage, 3) == [] == memory_problems(body, stage, 3)


#: Layouts whose trusted fields are edited: attention, MLA, state layers, quantized
#: cells, a drafter's own pool, pipeline stages, separate pools.
TRUST_SOURCES = ["layouts/llama-3.1-8b.yaml", "layouts/deepseek-v3.yaml",
                 "layouts/jamba-v0.1.yaml", "layouts/example-mixed-precision.yaml",
                 "layouts/example-glm5-next-drafter.yaml",
                 "layouts/example-pipeline-parallel.yaml", "layouts/pooling-separate.yaml"]
#: What connectors trust of a spec, and of a budget.
_SPEC_FIELDS = ("num_kv_heads", "head_size", "head_size_v", "block_size", "dtype",
                "page_size_bytes", "kind", "sliding_window", "shapes", "dtypes",
                "kv_lora_rank", "qk_rope_head_dim", "num_heads")


def _trust_edits(data: dict) -> list[tuple[str, dict]]:
    """Every one-field edit of a spec's geometry (each spec once) and of the budget's
    figures, the hash recomputed as an editor covering its tracks would."""
    out = []
    body = data["body"]
    targets: list[tuple[tuple, Any]] = []
    for i, spec in enumerate(body["specs"]):
        for key in _SPEC_FIELDS:
            if key in spec:
                targets.append((("specs", i, key), spec[key]))
    if body["budget"] is not None:
        targets += [(("budget", k), body["budget"][k]) for k in ("num_blocks", "memory")]
    for i, pool in enumerate((body["pooling"] or {}).get("pools", [])):
        if pool["budget"] is not None:
            targets.append((("pooling", "pools", i, "budget", "num_blocks"),
                            pool["budget"]["num_blocks"]))
    for path, value in targets:
        if isinstance(value, bool):
            news: list[Any] = []
        elif isinstance(value, int):
            news = [value + 1, value * 2, max(1, value // 2), value - 1]
        elif path[-1] == "dtype":
            news = ["float16" if value != "float16" else "bfloat16", "float32", "fp8_e4m3"]
        elif path[-1] == "kind":
            news = ["sliding_window", "full_attention", "mla"]
        elif path[-1] == "dtypes":
            news = [["float32"] * len(value)]
        elif path[-1] == "shapes":
            news = [[[d * 2 for d in shape] for shape in value]]
        else:
            news = []
        for new in news:
            if new == value or (isinstance(new, int) and new < 0):
                continue
            edited = copy.deepcopy(data)
            _set(edited["body"], path, new)
            out.append((".".join(map(str, path)) + f"={new!r}", resign(edited)))
    return out


@pytest.mark.parametrize("source", TRUST_SOURCES, ids=lambda s: Path(s).stem)
def test_what_reading_accepts_has_the_page_sizes_and_budget_its_fields_give(
        source: str) -> None:
    """The trust model's promise for what connectors read (issue 36): an edit of a
    spec's heads, head size, block size, dtype, kind or page size, or of the budget's
    block count or memory (hash recomputed), is refused, or leaves every spec's page
    size and every pool's budget count what the oracle works out from the fields
    (what stays accepted changes no byte: a state's fields within its padded page, a
    dtype of the same width, a budget a few bytes larger)."""
    data = json.loads(kvspec.compile(ROOT / source).text())
    refused, accepted = 0, []
    for name, edited in _trust_edits(data):
        try:
            art = Artifact.from_text(json.dumps(edited, indent=1), origin="x.kvlayout.json")
        except ArtifactError as err:
            assert err.hint, name  # noqa: PT017
            refused += 1
            continue
        assert untrusted_fields(art.body) == [], name
        accepted.append(name)
    # the figures themselves never pass edited; most edits of the fields do not either
    assert not [n for n in accepted if "page_size_bytes" in n or "num_blocks" in n], accepted
    assert refused > len(accepted), (refused, accepted)


def test_the_issues_two_edits_are_refused_by_every_reader(tmp_path: Path) -> None:
    """budget.num_blocks 20480 -> 20481 and num_kv_heads 8 -> 4, each re-hashed: refused
    by ``descriptor``, ``transfer`` and ``load``, at the field."""
    data = json.loads((ROOT / "layouts/llama-3.1-8b.kvlayout.json").read_text())
    for path, new, where in ((("budget", "num_blocks"), 20481, "body.budget.num_blocks"),
                             (("specs", 0, "num_kv_heads"), 4,
                              "body.specs[0].page_size_bytes")):
        edited = copy.deepcopy(data)
        _set(edited["body"], path, new)
        file = tmp_path / "x.kvlayout.json"
        file.write_text(json.dumps(resign(edited), indent=1))
        for args in (["descriptor", str(file)], ["transfer", str(file), str(file)],
                     ["descriptor", str(file), "--as", "vllm-nixl"]):
            code, out, err = invoke(args)
            assert (code, out) == (1, ""), (args, out)
            assert err.startswith(f"{file}:") and f"at: {where}" in err, err
        if importlib.util.find_spec("torch") is not None:
            with pytest.raises(ArtifactError, match="structure is unsound"):
                kvspec.load(file, device="meta")


@pytest.mark.parametrize("resigned", [False, True], ids=["raw", "re-hashed"])
@pytest.mark.parametrize("first", [256, 9], ids=["same-value", "other-value"])
def test_a_key_twice_in_one_object_is_refused_at_the_second(first: int, resigned: bool
                                                            ) -> None:
    """JSON readers disagree on which of two equal keys counts: refused at the second,
    as the source reader refuses it, whether the value repeats (the hash still
    matches) or differs and the hash was recomputed over what a last-wins reader sees."""
    text = (ROOT / "layouts/llama-3.1-8b.kvlayout.json").read_text()
    line = text[:text.index('"max_num_seqs": 256,')].count("\n") + 2
    edited = _retyped(text, '"max_num_seqs": 256,',
                      f'"max_num_seqs": {first},\n   "max_num_seqs": 256,')
    if resigned:
        edited = re.sub(r'"sha256": "[0-9a-f]{64}"',
                        f'"sha256": "{resign(json.loads(edited))["sha256"]}"', edited)
    with pytest.raises(ArtifactError, match="has the key 'max_num_seqs' twice") as info:
        Artifact.from_text(edited, origin="x.kvlayout.json")
    assert (info.value.line, info.value.column) == (line, 4)
    assert info.value.hint == RECOMPILE


def _retyped(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("edit", [
    ('"block_size": 16,', '"block_size": 16.0,'),  # 16 == 16.0 in Python, not in JSON
    ('"block_size": 16,', '"block_size": 16e0,'),
    ('"needs_zeroing": false', '"needs_zeroing": 0'),  # False == 0
    ('"block_size": 16,', '"block_size": 340282366920938463463374607431768211472,'),
    ('"block_size": 16,', '"block_size": NaN,'),
    ('"name": "', '"name": "\\ud800'),  # a lone surrogate
], ids=["float", "exponent", "bool-as-int", "int-past-64-bits", "nan", "lone-surrogate"])
def test_a_value_of_another_json_type_is_refused(edit: tuple[str, str]) -> None:
    """Edits Python's == cannot see (16.0 for 16, 0 for false), and values JSON
    parsers read differently, are refused: by the format's types or by the hash."""
    text = kvspec.compile(ROOT / "tests/data/runtime/tiny.yaml").text()
    with pytest.raises(ArtifactError, match=r"sha256|artifact format|JSON") as info:
        Artifact.from_text(_retyped(text, *edit), origin="x.kvlayout.json")
    assert info.value.hint


_ENVELOPE = ('{"format": "kvspec.layout/3", "compiler": "kvspec 0.3.0", "source_sha256": "'
             + "0" * 64 + '", "body": {"layers": %s}}')


#: kvspec.load maps onto torch tensors: without the runtime extra it refuses to run.
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="kvspec.load needs torch (the runtime extra)")

_UNHOLDABLE = pytest.mark.parametrize("text,first", [
    ("[" * 5000 + "]" * 5000, "1:66: error: an artifact is nested more than 64 levels deep"),
    (_ENVELOPE % ('{"a": ' * 990 + "1" + "}" * 990),
     "1:541: error: an artifact is nested more than 64 levels deep"),
    ('{"format": "kvspec.layout/3", "body": 1' + "0" * 5000 + "}",
     "1:39: error: a number with 5,001 digits: more than an artifact can hold"),
], ids=["deeper-than-json-recurses", "deep-objects", "5001-digits"])


@_UNHOLDABLE
def test_json_no_artifact_can_hold_is_refused_at_its_spot(
        text: str, first: str, tmp_path: Path) -> None:
    """Deep nesting and numbers too long: an error, positioned where there is a
    spot to name, never a RecursionError or a ValueError, from every command that
    reads an artifact and from reading it."""
    path = tmp_path / "x.kvlayout.json"
    path.write_text(text)
    for args in (["explain", str(path)], ["plan", str(path), "--memory", "1GiB"],
                 ["diff", str(path), str(path)]):
        code, _, err = invoke(args)
        assert code == (2 if args[0] == "diff" else 1), (args, err)  # diff: 1 is "differ"
        assert err.splitlines()[0].startswith(f"{path}:{first}"), (args, err)
        assert "  hint: " in err and "Traceback" not in err
    with pytest.raises(ArtifactError) as info:
        Artifact.read(path)
    assert str(info.value).splitlines()[0] == f"{path}:{first}"


@needs_torch
@_UNHOLDABLE
def test_load_refuses_json_no_artifact_can_hold_at_its_spot(
        text: str, first: str, tmp_path: Path) -> None:
    path = tmp_path / "x.kvlayout.json"
    path.write_text(text)
    with pytest.raises(ArtifactError) as info:
        kvspec.load(path, device="meta")
    assert str(info.value).splitlines()[0] == f"{path}:{first}"


@pytest.mark.parametrize("depth", [100, 900, 985])
def test_nesting_is_refused_however_deep(depth: int, tmp_path: Path) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2 * depth)  # to write the file; reading has the default
    try:
        data = resign(json.loads(_ENVELOPE % ("[" * depth + "]" * depth)))
        text = json.dumps(data)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(ArtifactError):
        Artifact.from_text(text, origin="x.kvlayout.json")
    with pytest.raises(ArtifactError):
        Artifact.from_dict(data)
    path = tmp_path / "x.kvlayout.json"
    path.write_text(text)
    code, _, err = invoke(["explain", str(path)])
    assert code == 1 and err.startswith(f"{path}") and "Traceback" not in err, err


def test_compile_does_not_take_a_deeply_nested_file_for_its_own(tmp_path: Path) -> None:
    out = tmp_path / "a.kvlayout.json"
    out.write_text("[" * 5000 + "]" * 5000)
    code, _, err = invoke(["compile", "-q", "layouts/llama-3.1-8b.yaml", "-o", str(out)])
    assert code != 0 and "Traceback" not in err and "--force" in err, err
    assert out.read_text() == "[" * 5000 + "]" * 5000


def test_check_and_explain_do_not_recurse_on_deep_json(tmp_path: Path) -> None:
    source = tmp_path / "llama.yaml"
    source.write_text((ROOT / "layouts/llama-3.1-8b.yaml").read_text())
    (tmp_path / "llama.kvlayout.json").write_text("[" * 5000 + "]" * 5000)
    code, out, err = invoke(["check", str(tmp_path)])
    assert code == 1 and "Traceback" not in out + err, out + err
    assert f"{tmp_path / 'llama.kvlayout.json'}: stale: not a readable artifact" in out + err
    deep = tmp_path / "deep.yaml"
    deep.write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    code, _, err = invoke(["explain", str(deep)])
    assert code == 1 and "Traceback" not in err, err
    assert err.startswith(f"{deep}:1:"), err


def test_an_artifact_without_its_sha256_says_so() -> None:
    data = json.loads(kvspec.compile(ROOT / "tests/data/runtime/tiny.yaml").text())
    want = data.pop("sha256")
    with pytest.raises(ArtifactError, match="has no sha256") as info:
        Artifact.from_text(json.dumps(data), origin="x.kvlayout.json")
    assert info.value.expected == f"sha256: {want} (over the rest)"
    assert info.value.found == "no sha256"


def test_a_zero_layer_stride_is_refused_at_the_tensor() -> None:
    """Every layer's view on the same bytes (what the first round accepted), the
    hash recomputed: refused by the structure, pointing at the edited value."""
    data = json.loads(kvspec.compile(ROOT / "tests/data/runtime/tiny.yaml").text())
    for tensor in data["body"]["stages"][0]["tensors"]:
        tensor["layer_stride"] = 0
    text = json.dumps(resign(data), indent=1)
    with pytest.raises(ArtifactError, match="structure is unsound") as info:
        Artifact.from_text(text, origin="x.kvlayout.json")
    assert info.value.path == "body.stages[0].tensors[0].layer_stride"
    assert "of one tensor start together" in info.value.found
    line = text.splitlines()[info.value.line - 1]
    assert line.strip() == '"layer_stride": 0,' and line[info.value.column - 1:] == "0,"


@needs_torch
def test_a_view_past_its_pool_is_refused_by_load_at_its_count() -> None:
    """The structure is proved again for the block count load allocates."""
    data = json.loads(kvspec.compile(ROOT / "tests/data/runtime/tiny.yaml").text())
    pool = data["body"]["stages"][0]["pools"][0]
    pool["bytes_per_block"] -= 2  # the pool ends before the last block's pages
    data["body"]["stages"][0]["bytes_per_block"] -= 2
    with pytest.raises(ArtifactError, match=r"outside pool|unsound|useful"):
        kvspec.load(resign(data), device="meta", num_blocks=64)


@pytest.mark.parametrize("path", FORMAT2, ids=lambda p: p.stem)
def test_artifacts_of_format_2_are_refused_naming_the_version(path: Path) -> None:
    """Format 2 (kvspec 0.2) artifacts are kept as fixtures: this kvspec reads
    format 3 only, and says so, from the reader and from every command."""
    with pytest.raises(ArtifactError) as info:
        Artifact.read(path)
    assert info.value.message == FORMAT2_REFUSED
    assert "recompile its source" in info.value.hint
    for args in (["explain", str(path)], ["plan", str(path)]):
        code, out, err = invoke(args)
        assert code == 1 and "kvspec.layout/2" in out + err, (args, out, err)


@needs_torch
@pytest.mark.parametrize("path", FORMAT2, ids=lambda p: p.stem)
def test_load_refuses_format_2_naming_the_version(path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        kvspec.load(path, device="meta")
    assert info.value.message == FORMAT2_REFUSED
    assert "recompile its source" in info.value.hint
