"""Error goldens: each ``tests/errors/<name>.yaml`` beside ``<name>.expected``,
which holds the exit code on its first line and then the exact message.
``KVSPEC_REGEN=1`` rewrites the expected files; review them before committing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, check_golden, invoke

ERRORS = ROOT / "tests" / "errors"
CASES = sorted(ERRORS.glob("*.yaml"))


@pytest.mark.parametrize("source", CASES, ids=lambda p: p.stem)
def test_error_golden(source: Path) -> None:
    rel = str(source.relative_to(ROOT))
    code, _, err = invoke(["validate", rel])
    got = f"{code}\n{err}"
    check_golden(source.with_suffix(".expected"), got)
    assert code == 1
    assert "Traceback" not in err
    # every error names the file first: the source's, or the trace's it names
    where = {"pooling-bad-trace": "tests/errors/traces/",
             "pooling-step-time-other-deployment": "tests/errors/profiles/"}.get(source.stem,
                                                                                 rel)
    assert err.startswith(f"{where}"), "every error names the file first"


def test_missing_file_is_a_clear_error() -> None:
    code, _, err = invoke(["validate", "no/such/file.yaml"])
    assert code == 1
    assert err.startswith("no/such/file.yaml: error: no such file")


def test_usage_error_exits_2() -> None:
    code, _, err = invoke(["compile"])
    assert code == 2
    assert "error: missing argument SOURCE" in err and "hint:" in err
    code, _, err = invoke(["plan", "layouts/llama-3.1-8b.yaml", "--memory", "lots"])
    assert code == 2
    assert "--memory: cannot read 'lots' as a size" in err


# -- the error's fields are typed attributes ------------------------------------


def test_an_errors_fields_are_typed_attributes_and_survive_copies() -> None:
    import pickle
    import typing

    from kvspec.errors import ErrorList, KvspecError, NotEnoughMemoryError, UsageError

    err = NotEnoughMemoryError("no room", needed_bytes=2, available_bytes=1, max_model_len=8,
                               estimated_max_model_len=4, hint="give it more memory")
    assert "__getattr__" not in vars(KvspecError)
    hints = typing.get_type_hints(NotEnoughMemoryError)
    assert all(hints[f] is int for f in ("needed_bytes", "available_bytes", "max_model_len",
                                         "estimated_max_model_len"))
    for copy in (err.replace(hint="more"), err.as_type(UsageError),
                 pickle.loads(pickle.dumps(err))):
        assert (copy.needed_bytes, copy.estimated_max_model_len) == (2, 4)  # type: ignore[attr-defined]
    both = ErrorList([err, KvspecError("other", hint="h")])
    assert both.errors[0] is err and pickle.loads(pickle.dumps(both)).render() == both.render()
    with pytest.raises(AttributeError):
        KvspecError("plain", hint="h").needed_bytes  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(TypeError):
        KvspecError("no such field", hint="h", needed_bytes=2)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="immutable"):
        err.needed_bytes = 3  # type: ignore[misc]


def test_a_missing_view_is_a_kvspec_error_and_still_a_key_error() -> None:
    """``cache.kv`` and ``cache.parts`` raise a located, hinted error, and keep the
    mapping protocol (``.get`` answers ``None``)."""
    pytest.importorskip("torch", reason="the views are torch tensors")
    from kvspec.errors import KvspecError
    from kvspec.runtime.views import CellParts, KVViews

    for views in (KVViews({}, {}), CellParts({}, {})):
        assert views.get("layers.0") is None and "layers.0" not in views
        with pytest.raises(KvspecError) as caught:
            views["layers.0"]
        assert isinstance(caught.value, KeyError) and caught.value.hint
        assert caught.value.render().startswith("kvspec: error: ")
