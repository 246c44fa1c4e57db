"""The ``vllm.general_plugins`` entry point: does nothing unless ``KVSPEC_LAYOUT`` is set.

vLLM calls :func:`register` once in every process (the API server, the engine
core, each worker). With ``KVSPEC_LAYOUT=path/model.kvlayout.json`` it reads
and verifies the artifact (a tampered or stale one stops the process) and
routes vLLM's KV-cache planning through kvspec's builder, which checks the
engine against the artifact before anything is allocated:

* ``KVSPEC_MODE=verify`` (default): vLLM plans as usual; its KV-cache config
  must equal the artifact's;
* ``KVSPEC_MODE=enforce``: the groups, tensors and block count come from the
  artifact's placement, for the engine's budget.

Either way drift (another vLLM, a changed flag, a changed model) stops the
engine with a message naming the layer, the field and both values
(docs/vllm.md). This module imports nothing heavy: vLLM logs and skips a
plugin whose import fails, so the import must not.
"""

from __future__ import annotations

import os

#: Environment variables the plugin reads.
LAYOUT_ENV, MODE_ENV = "KVSPEC_LAYOUT", "KVSPEC_MODE"


def register() -> None:
    """Called by vLLM in every process (``vllm.plugins.load_general_plugins``)."""
    path = os.environ.get(LAYOUT_ENV)
    if not path:
        return
    # deferred: the plugin is an entry point vLLM loads in every process; kvspec's
    # reader and planner load only when KVSPEC_LAYOUT asks for them
    from kvspec.integrations import vllm as bridge
    from kvspec.integrations.vllm.guard import Expectation

    expectation = Expectation.read(path, os.environ.get(MODE_ENV) or "verify")
    adapter = bridge.adapter(offline=False)
    adapter.install(expectation)
