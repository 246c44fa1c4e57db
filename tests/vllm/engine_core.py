"""Drive vLLM's KV-cache planning the way ``EngineCore._initialize_kv_caches`` does,
with the case's layers as the engine reports them (no GPU, no model weights).

``python -m tests.vllm.engine_core CASE [MEMORY]`` does it in a fresh process that
loads vLLM's general plugins first, as the engine core does (KVSPEC_* from the
environment), and prints the outcome as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kvspec.compiled import CompiledArtifact as Artifact
from kvspec.compiled import read as read_artifact
from kvspec.integrations.vllm.guard import Expectation


def plan(adapter: Any, name: str, art: Artifact, memory: int | None = None,
         **settings: Any) -> dict[str, Any]:
    """vLLM's planning of case ``name`` with its own (engine-reported) specs, for the
    artifact's engine settings (``settings`` overrides some: a changed flag)."""
    from kvspec.integrations.vllm.v0_33 import specs as vspecs
    from tests.vllm.cases import engine_stages

    stages = [{n: vspecs.describe(s) for n, s in st.items()}
              for st in engine_stages(name, art)]
    s = {**Expectation(art, "-", "verify").settings(), **settings}
    budget = memory if memory is not None else art.layout.budget.memory
    return adapter.plan(s, stages, budget)


def main(argv: list[str]) -> int:
    import os

    from vllm.plugins import load_general_plugins

    from kvspec.integrations import vllm as bridge

    adapter = bridge.adapter()
    load_general_plugins()  # what EngineCore.__init__ does first
    art = read_artifact(os.environ["KVSPEC_LAYOUT"])
    out = plan(adapter, argv[0], art, int(argv[1]) if len(argv) > 1 else None)
    print(json.dumps({k: out.get(k) for k in ("ok", "error", "builder", "num_blocks",
                                               "kv_cache_tensors")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
