"""``kvspec schema``: the committed JSON Schemas are current, every artifact fits one, and
a JSON Schema validator (what an editor runs) takes exactly the sources kvspec takes."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from kvspec.artifact import Artifact
from kvspec.artifact.read import format_problems as schema_problems
from kvspec.artifact.text import canonical, sha256_of
from kvspec.cli import cli
from kvspec.compiler import compile_source
from kvspec.errors import ArtifactError, KvspecError
from kvspec.files import MAX_MEMORY, size_bytes
from kvspec.integrations.dump.importer import dump_to_yaml
from kvspec.model.pooling import Lengths, Pooling, Workload
from kvspec.model.workloads import FORMATS, TraceFormat
from kvspec.reports.schemas import (
    SCHEMA_DIALECT,
    StaleSchemaError,
    artifact_schema,
    check_schemas,
    render,
    source_schema,
)
from kvspec.source.document import parse_yaml
from kvspec.source.parse import parse_source
from kvspec.source.pooling import pooling_of
from kvspec.source.schema import PoolingPolicy, WorkloadSpec
from tests.conftest import CONFORMANCE, ROOT, invoke

SCHEMAS = ROOT / "schemas"
ARTIFACTS = sorted((ROOT / "layouts").glob("*.kvlayout.json")) + \
    sorted((ROOT / "tests" / "golden").glob("*.kvlayout.json"))


def test_committed_schemas_are_current() -> None:
    from kvspec.cli.schema import _files

    stale = check_schemas(SCHEMAS, _files())
    assert not stale, "\n".join(
        [f"{', '.join(str(f.path) for f in stale)} stale: run `kvspec schema` and commit"]
        + [line for f in stale for line in f.diff()])


def test_schema_headers_and_determinism() -> None:
    for build, title in ((source_schema, "kvspec layout source (format 1)"),
                         (artifact_schema, "kvspec layout artifact (kvspec.layout/3)")):
        schema = build()
        assert schema["$schema"] == SCHEMA_DIALECT
        assert schema["$id"].startswith("urn:kvspec:schema:")
        assert schema["title"] == title
        text = render(schema)
        assert text == render(build()) and text.endswith("}\n")
        assert list(json.loads(text)) == sorted(json.loads(text))


def test_source_schema_describes_the_source_model() -> None:
    schema = json.loads((SCHEMAS / "source.schema.json").read_text())
    assert set(schema["required"]) == {"kvspec", "name", "engine"}
    assert schema["properties"]["kvspec"]["const"] == 1
    assert schema["additionalProperties"] is False
    engine = schema["$defs"]["EnginePolicy"]["properties"]
    assert {"block_size", "max_model_len", "memory", "layout", "hybrid"} <= set(engine)
    # sizes may be written as bytes or as '40GiB'
    assert {t.get("type") for t in engine["memory"]["anyOf"]} == {"string", "integer", "null"}


@pytest.mark.parametrize("model,source,renamed", [
    (Workload, WorkloadSpec, {"trace_format": "format"}), (Pooling, PoolingPolicy, {})])
def test_the_source_pooling_fields_are_the_models(model: type, source: Any,
                                                  renamed: dict[str, str]) -> None:
    """Pooling is declared once (kvspec.model.pooling): each field the source takes
    has the model field's default and doc line (block_sizes aside: the source's None
    stands for the model's default)."""
    declared = [f for f in fields(model) if "doc" in f.metadata]
    assert declared
    for f in declared:
        given = source.model_fields[renamed.get(f.name, f.name)]
        assert (given.default, given.description) == (f.default, f.metadata["doc"]), f.name
    tried = ", ".join(map(str, Pooling().block_sizes))  # 16, 32, 64, 128
    assert f"(default {tried})" in (PoolingPolicy.model_fields["block_sizes"].description or "")


POOLING = """
pooling:
  policy: auto
  serve_with: kvspec
  max_groups: 3
  block_sizes: [64, 32, 32]
  workload: {context_tokens: 1000, output_tokens: 100, concurrency: 8, draft_tokens: 2,
             prefix_sharing: 0.5, prefix_tokens: 128, requests: 50, seed: 3, step_ms: 10.0}
"""


def test_the_source_pooling_section_is_carried_to_the_model_field_by_field() -> None:
    text = (ROOT / "layouts" / "llama-3.1-8b.yaml").read_text() + POOLING
    doc = parse_yaml(text, "llama.yaml")
    workload = Workload(context=Lengths(1000), output=Lengths(100), concurrency=8,
                        draft_tokens=2, prefix_sharing=0.5, prefix_tokens=128, requests=50,
                        seed=3, step_ms=10.0)
    assert pooling_of(parse_source(doc), doc) == Pooling(
        policy="auto", serve_with="kvspec", workload=workload, max_groups=3,
        block_sizes=(32, 64))


def test_the_trace_formats_are_listed_in_their_literals_order() -> None:
    assert tuple(FORMATS) == get_args(TraceFormat)


def test_artifact_schema_describes_affine_byte_forms() -> None:
    schema = json.loads((SCHEMAS / "artifact.schema.json").read_text())
    tensor = schema["$defs"]["Tensor"]["properties"]
    forms = tensor["offset"]["anyOf"]
    assert {"type": "integer", "minimum": 0} in forms and {"$ref": "#/$defs/Affine"} in forms
    assert set(schema["$defs"]["Affine"]["required"]) == {"per_block", "fixed"}
    assert schema["$defs"]["Affine"]["additionalProperties"] is False


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_artifacts_match_the_artifact_schema(path: Path) -> None:
    assert schema_problems(json.loads(path.read_text())) == []


@pytest.mark.parametrize("case", sorted(p.stem for p in (CONFORMANCE / "cases").glob("*.json")))
def test_every_compiled_conformance_case_matches_the_artifact_schema(case: str) -> None:
    dump = json.loads((CONFORMANCE / "cases" / f"{case}.json").read_text())
    try:
        artifact = compile_source(dump_to_yaml(dump), f"{case}.yaml")
    except KvspecError:  # a case the planner rejects (not enough memory) has no artifact
        pytest.skip("rejected at compile time")
    assert schema_problems(json.loads(artifact.text())) == []


def _llama_artifact() -> dict:
    return json.loads((ROOT / "layouts" / "llama-3.1-8b.kvlayout.json").read_text())


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["body"].update(extra=1), "$.body"),
    (lambda d: d["body"]["stages"][0]["tensors"][0].update(offset={"per_block": 1}),
     "$.body.stages[0].tensors[0].offset"),
    (lambda d: d["body"]["groups"][0].update(block_size="16"), "$.body.groups[0].block_size"),
    (lambda d: d["body"]["groups"][0].update(block_size=0), "$.body.groups[0].block_size"),
    (lambda d: d.update(sha256="xyz"), "$.sha256"),
])
def test_artifacts_off_the_schema_are_rejected(edit, where: str) -> None:
    data = copy.deepcopy(_llama_artifact())
    edit(data)
    problems = schema_problems(data)
    assert len(problems) == 1 and problems[0].endswith(f"- at `{where}`"), problems
    if where != "$.sha256":  # a recomputed hash does not make it readable
        rest = {k: v for k, v in data.items() if k != "sha256"}
        data["sha256"] = sha256_of(canonical(rest))
        with pytest.raises(ArtifactError) as exc:
            Artifact.from_dict(data, origin="x.kvlayout.json")
        assert exc.value.file == "x.kvlayout.json"
        assert "does not match the artifact format" in exc.value.message
        assert exc.value.path == where.removeprefix("$.")


def test_an_artifact_of_another_format_is_refused_naming_it() -> None:
    data = copy.deepcopy(_llama_artifact())
    data["format"] = "kvspec.layout/2"
    with pytest.raises(ArtifactError) as exc:
        Artifact.from_dict(data, origin="x.kvlayout.json")
    assert exc.value.message == ("this artifact is format kvspec.layout/2; this kvspec reads "
                                 "kvspec.layout/3 only")


# -- the committed schemas under a JSON Schema validator (what editors run) ------
#
# An editor checks a source against schemas/source.schema.json as it is typed
# (the ``# yaml-language-server: $schema=`` line every source carries): the
# schema must accept every source kvspec accepts and refuse what kvspec's source
# model refuses, or the editor marks good files bad and misses bad ones.

_SOURCE_SCHEMA = json.loads((SCHEMAS / "source.schema.json").read_text())
_ARTIFACT_SCHEMA = json.loads((SCHEMAS / "artifact.schema.json").read_text())
_SOURCE_CHECK = jsonschema.Draft202012Validator(_SOURCE_SCHEMA)
_ARTIFACT_CHECK = jsonschema.Draft202012Validator(_ARTIFACT_SCHEMA)


def _schema_problems(check: jsonschema.Draft202012Validator, data: Any) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in check.iter_errors(data)]


def test_the_committed_schemas_are_valid_json_schemas() -> None:
    for schema in (_SOURCE_SCHEMA, _ARTIFACT_SCHEMA):
        jsonschema.Draft202012Validator.check_schema(schema)


def _compiled_sources() -> list[tuple[str, str]]:
    """(name, text) of every source kvspec compiles from this repository: the
    layouts, the golden and runtime sources, every conformance case imported,
    and what ``kvspec init`` writes for every committed Hugging Face config."""
    from kvspec.integrations.hf.init import InitOptions, init_source

    files = (sorted((ROOT / "layouts").glob("*.yaml")) + sorted((ROOT / "tests" / "golden").glob(
        "*.yaml")) + sorted((ROOT / "tests" / "data" / "runtime").glob("*.yaml")))
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in files]
    out += [(f"import {p.stem}", dump_to_yaml(json.loads(p.read_text())))
            for p in sorted((CONFORMANCE / "cases").glob("*.json"))]
    out += [(f"init {p.stem}", init_source(json.loads(p.read_text()), InitOptions(
        name=p.stem, memory=80 * 2**30, max_model_len=8192)))
            for p in sorted((ROOT / "tests" / "data" / "hf").glob("*.json"))]
    return out


_COMPILED = _compiled_sources()


@pytest.mark.parametrize("name, text", _COMPILED, ids=[n for n, _ in _COMPILED])
def test_the_source_schema_accepts_every_source_kvspec_takes(name: str, text: str) -> None:
    try:
        artifact = compile_source(text, f"{name}.yaml")
    except KvspecError:  # refused on purpose (a budget too small): its schema still holds
        artifact = None
    assert _schema_problems(_SOURCE_CHECK, yaml.safe_load(text)) == []
    if artifact is not None:
        assert _schema_problems(_ARTIFACT_CHECK, json.loads(artifact.text())) == []


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_artifact_schema_accepts_every_committed_artifact(path: Path) -> None:
    assert _schema_problems(_ARTIFACT_CHECK, json.loads(path.read_text())) == []


def _json_can_say(data: Any, seen: set[int] | None = None) -> bool:
    """Whether ``data`` means in JSON what it means in YAML: string keys only (a
    JSON Schema cannot see a YAML key's type) and no float equal to an integer
    (JSON Schema's ``integer`` takes 16.0, which a source refuses). Each shared
    value (a YAML alias) is looked at once: an alias bomb is a small graph."""
    seen = set() if seen is None else seen
    if id(data) in seen:
        return True
    if isinstance(data, dict):
        seen.add(id(data))
        return all(isinstance(k, str) and _json_can_say(k, seen) and _json_can_say(v, seen)
                   for k, v in data.items())
    if isinstance(data, list):
        seen.add(id(data))
        return all(_json_can_say(v, seen) for v in data)
    if isinstance(data, str):  # a lone surrogate is no UTF-8 JSON text can carry
        # nor can a pattern bound a size's value: "1000000TiB" matches the size grammar,
        # and only the model knows it is more than any rank has (issue 36)
        size = size_bytes(data)
        return not any("\ud800" <= ch <= "\udfff" for ch in data) and \
            (size is None or size <= MAX_MEMORY)
    if isinstance(data, float) and not math.isfinite(data):
        return False  # .inf and .nan: JSON has no such numbers (the model refuses them)
    return not (isinstance(data, float) and data.is_integer())


def _model_takes(doc: Any) -> bool:
    from kvspec.source.parse import parse_source
    try:
        parse_source(doc)
    except KvspecError:
        return False
    return True


_BASE = yaml.safe_load((ROOT / "layouts" / "llama-3.1-8b.yaml").read_text())


@pytest.mark.parametrize("path, value", [
    *((("engine", "memory"), v) for v in (
        "40GiB", "40 gib", " 80GB ", "1.5GiB", "512MiB", "4096", "8b", "1KB", 0, 2**40,
        "40G", "40GiBs", "40 Gi", "4,096", "1.5", "-1GiB", "", "٤٠GiB", -1, True)),  # noqa: RUF001 - Arabic-Indic digits, on purpose
    *((("layer_types", "attn", "tokens_per_state"), v) for v in (
        1, 8, "1/2", " 3 / 4 ", "16", "002", "1\t/2", 0, -1, "0", "0/1", "1/0", "00", "1/2/3",
        "1.5", "½", True)),
    *((("layer_types", name), {"kind": "full_attention"}) for name in (
        "global", "ok-name", "a b", "a+b", "-", " - ", " ", "")),
    *((("kvspec",), v) for v in (1, 2, "1", True, None)),
    *((("engine", "max_model_len"), v) for v in (8192, "auto", 0, "8192", True, 2**31 + 1)),
], ids=repr)
def test_the_source_schema_and_the_source_model_agree_on_each_grammar(path: tuple,
                                                                     value: Any) -> None:
    """Each field with a grammar of its own (sizes, token fractions, layer type
    names, the version), value by value, good and bad alike. Left out: what no
    JSON Schema can say, a decimal size that is no whole number of bytes
    ("1.0001KB") and a token fraction over 2**31."""
    from kvspec.source.document import Document

    data = copy.deepcopy(_BASE)
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    problems = _schema_problems(_SOURCE_CHECK, data)
    assert _model_takes(Document(data, "x.yaml")) == (not problems), problems


def test_the_source_schema_and_the_source_model_agree_on_mutated_sources() -> None:
    """Every seed source (good and bad) and 1,500 seeded mutations of them: where
    the YAML reads, the JSON Schema takes exactly what the source model takes."""
    import random

    from kvspec.source.document import parse_yaml
    from tests.fuzz.generators import mutate_source, source_seeds

    seeds = source_seeds()
    rng = random.Random(14)
    inputs = [data for _, data in seeds]
    inputs += [mutate_source(rng, rng.choice(inputs[:len(seeds)]), others=inputs[:len(seeds)],
                             big=False)[0] for _ in range(1500)]
    agreed = Counter()
    for data in inputs:
        try:
            doc = parse_yaml(data.decode("utf-8"), "x.yaml")
        except (UnicodeDecodeError, KvspecError):
            continue
        if not _json_can_say(doc.data):
            continue
        model = _model_takes(doc)
        problems = _schema_problems(_SOURCE_CHECK, doc.data)
        assert model == (not problems), (data.decode(), problems)
        agreed[model] += 1
    assert agreed[True] >= 100 and agreed[False] >= 100, agreed  # both sides exercised


def test_the_artifact_schema_and_the_artifact_model_agree_on_edited_artifacts() -> None:
    """Every committed artifact and 600 seeded one-field edits of them (a value
    retyped or replaced, a field dropped or added): the JSON Schema takes exactly
    what kvspec's artifact model takes (the hash aside, which no schema checks)."""
    import random

    from tests.fuzz.generators import _get, _paths, _retyped, _set

    artifacts = [json.loads(p.read_text()) for p in ARTIFACTS]
    values = [0, 1, -1, 16, 2**40, "x", "", None, True, False, 1.5, [], {}, [1], {"a": 1},
              "bfloat16", "LBNHC", {"per_block": 1, "fixed": 0}]
    rng = random.Random(14)
    cases = list(artifacts)
    for _ in range(600):
        data = copy.deepcopy(rng.choice(artifacts))
        path = rng.choice([p for p in _paths(data) if p])
        op, parent = rng.choice(["retype", "drop", "add", "value"]), _get(data, path[:-1])
        if op == "drop":
            del parent[path[-1]]
        elif op == "add" and isinstance(_get(data, path), dict):
            _get(data, path)[rng.choice(["extra", "kind", "group", "per_block"])] = \
                rng.choice(values)
        elif op == "value":
            _set(data, path, rng.choice(values))
        else:
            _set(data, path, _retyped(rng, _get(data, path)))
        cases.append(data)
    agreed = Counter()
    for data in cases:
        if not _json_can_say(data):
            continue
        model = not schema_problems(data)
        problems = _schema_problems(_ARTIFACT_CHECK, data)
        assert model == (not problems), (schema_problems(data), problems)
        agreed[model] += 1
    assert agreed[True] >= 100 and agreed[False] >= 100, agreed  # both sides exercised


# -- the command ------------------------------------------------------------


def test_schema_check_passes_on_the_committed_schemas() -> None:
    result = CliRunner().invoke(cli, ["schema", "--check"])
    assert (result.exit_code, result.output) == (0, "schemas: schemas are current\n")


def test_schema_writes_then_checks(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    result = CliRunner().invoke(cli, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == (f"wrote {out}/source.schema.json\n"
                             f"wrote {out}/artifact.schema.json\n"
                             f"wrote {out}/descriptor.schema.json\n"
                             f"wrote {out}/profile.schema.json\n"
                             f"wrote {out}/sweep.schema.json\n")
    for name in ("source.schema.json", "artifact.schema.json", "descriptor.schema.json",
                 "profile.schema.json", "sweep.schema.json"):
        assert (out / name).read_text() == (SCHEMAS / name).read_text()
    again = CliRunner().invoke(cli, ["schema", "-o", str(out)])
    assert again.output == f"{out}: schemas are current\n"


def test_schema_check_reports_stale_and_missing_with_a_diff(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    out.mkdir()
    (out / "source.schema.json").write_text(
        (SCHEMAS / "source.schema.json").read_text().replace('"title": "Name"', '"title": "N"'))
    result = CliRunner().invoke(cli, ["schema", "--check", "-o", str(out)])
    assert result.exit_code == 1
    assert isinstance(result.exception, StaleSchemaError)
    lines = result.output.splitlines()
    assert lines[0] == f"{out}/source.schema.json: stale"
    assert f"  --- {out}/source.schema.json (committed)" in lines
    assert '  -      "title": "N",' in lines and '  +      "title": "Name",' in lines
    assert lines[-4:] == [f"{out}/artifact.schema.json: missing",
                          f"{out}/descriptor.schema.json: missing",
                          f"{out}/profile.schema.json: missing",
                          f"{out}/sweep.schema.json: missing"]
    assert "run `kvspec schema -o" in result.exception.render()
    assert not (out / "artifact.schema.json").exists()  # --check writes nothing


def test_schema_writes_the_sweep_schema_that_sweep_md_names(tmp_path: Path) -> None:
    """docs/sweep.md's grid starts with a ``$schema`` line naming
    schemas/sweep.schema.json: ``kvspec schema`` writes that file, the committed one
    is what it writes, and ``--check`` sees it go stale."""
    page = (ROOT / "docs" / "sweep.md").read_text()
    assert "# yaml-language-server: $schema=schemas/sweep.schema.json" in page
    out = tmp_path / "schemas"
    assert CliRunner().invoke(cli, ["schema", "-o", str(out)]).exit_code == 0
    assert (out / "sweep.schema.json").read_text() == (SCHEMAS / "sweep.schema.json").read_text()
    (out / "sweep.schema.json").write_text("{}\n")
    result = CliRunner().invoke(cli, ["schema", "--check", "-o", str(out)])
    assert result.exit_code == 1 and f"{out}/sweep.schema.json: stale" in result.output


def test_schema_check_exit_code_through_main(tmp_path: Path) -> None:
    code, _, stderr = invoke(["schema", "--check", "-o", str(tmp_path)])
    assert code == 1
    assert stderr.startswith(f"{tmp_path}: error: 5 schema file(s) differ from what kvspec "
                             "generates")

