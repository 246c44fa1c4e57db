"""Integrations on top of the compiler: ``init --from-hf`` (:mod:`.hf`), spec-dump
``import`` (:mod:`.dump`), vLLM's config-stage rules (:mod:`.rules`) and the vLLM
bridge (:mod:`.vllm`)."""
