"""``kvspec schema``: the committed JSON Schemas are current, and every artifact fits one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvspec.artifact.schema import schema_problems
from kvspec.cli import cli
from kvspec.compiler import compile_source
from kvspec.errors import ArtifactError, KvspecError
from kvspec.integrations.dump.importer import dump_to_yaml
from kvspec.reports.schemas import (
    SCHEMA_DIALECT,
    StaleSchemaError,
    artifact_schema,
    check_schemas,
    render,
    source_schema,
)
from tests.conftest import CONFORMANCE, ROOT, invoke

SCHEMAS = ROOT / "schemas"
ARTIFACTS = sorted((ROOT / "layouts").glob("*.kvlayout.json")) + \
    sorted((ROOT / "tests" / "golden").glob("*.kvlayout.json"))


def test_committed_schemas_are_current() -> None:
    stale = check_schemas(SCHEMAS)
    assert not stale, "\n".join(
        [f"{', '.join(str(f.path) for f in stale)} stale: run `kvspec schema` and commit"]
        + [line for f in stale for line in f.diff()])


def test_schema_headers_and_determinism() -> None:
    for build, title in ((source_schema, "kvspec layout source (format 1)"),
                         (artifact_schema, "kvspec layout artifact (kvspec.layout/2)")):
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


def test_artifact_schema_describes_affine_byte_forms() -> None:
    schema = json.loads((SCHEMAS / "artifact.schema.json").read_text())
    tensor = schema["$defs"]["TensorEntry"]["properties"]
    forms = tensor["offset"]["anyOf"]
    assert {"type": "integer", "minimum": 0} in forms and {"$ref": "#/$defs/AffineBytes"} in forms
    assert set(schema["$defs"]["AffineBytes"]["required"]) == {"per_block", "fixed"}


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
    (lambda d: d["body"].update(extra=1), "body.extra"),
    (lambda d: d["body"]["stages"][0]["tensors"][0].update(offset={"per_block": 1}),
     "body.stages.0.tensors.0.offset"),
    (lambda d: d["body"]["groups"][0].update(block_size="16"), "body.groups.0.block_size"),
    (lambda d: d.update(format="kvspec.layout/3"), "format"),
    (lambda d: d.update(sha256="xyz"), "sha256"),
])
def test_artifacts_off_the_schema_are_rejected(edit, where: str) -> None:
    from kvspec.artifact import envelope_hash
    from kvspec.artifact.verify import verified

    data = copy.deepcopy(_llama_artifact())
    edit(data)
    where = where.replace(".", "\\.") if False else where
    assert any(p.startswith(where.replace(".0.", ".0.")) or where in p
               for p in schema_problems(data)), schema_problems(data)
    if where not in ("format", "sha256"):  # a recomputed hash does not make it readable
        data["sha256"] = envelope_hash(data)
        with pytest.raises(ArtifactError) as exc:
            verified(data, origin="x.kvlayout.json")
        assert exc.value.file == "x.kvlayout.json"
        assert where in exc.value.found


def test_jsonschema_agrees_when_installed() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    art = json.loads((SCHEMAS / "artifact.schema.json").read_text())
    src = json.loads((SCHEMAS / "source.schema.json").read_text())
    for path in ARTIFACTS:
        jsonschema.validate(json.loads(path.read_text()), art)
    for path in sorted((ROOT / "layouts").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), src)


# -- the command ------------------------------------------------------------


def test_schema_check_passes_on_the_committed_schemas() -> None:
    result = CliRunner().invoke(cli, ["schema", "--check"])
    assert (result.exit_code, result.output) == (0, "schemas: schemas are current\n")


def test_schema_writes_then_checks(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    result = CliRunner().invoke(cli, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == (f"wrote {out}/source.schema.json\n"
                             f"wrote {out}/artifact.schema.json\n")
    for name in ("source.schema.json", "artifact.schema.json"):
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
    assert lines[-1] == f"{out}/artifact.schema.json: missing"
    assert "run `kvspec schema -o" in result.exception.render()
    assert not (out / "artifact.schema.json").exists()  # --check writes nothing


def test_schema_check_exit_code_through_main(tmp_path: Path) -> None:
    code, _, stderr = invoke(["schema", "--check", "-o", str(tmp_path)])
    assert code == 1
    assert stderr.startswith(f"{tmp_path}: error: 2 schema file(s) differ from what kvspec "
                             "generates")

