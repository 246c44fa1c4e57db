"""Tests against the real vLLM 0.33.0 (marked ``vllm``; skipped when vLLM is absent).

Run them with ``bash tests/vllm/run.sh`` (a second venv with vllm==0.33.0 pinned), or
in any environment where vLLM is installed: ``python -m pytest tests/vllm -m vllm``.
vLLM runs on its CPU platform; models are built on the meta device, no GPU is used.
"""

from __future__ import annotations

import os

from kvspec.integrations.vllm import OFFLINE_ENV

# Before any test module imports vLLM: the CPU platform, logs on stderr.
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
