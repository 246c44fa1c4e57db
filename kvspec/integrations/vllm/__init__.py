"""The vLLM bridge (``pip install 'kvspec[vllm]'``): layer specs from vLLM's own model
code, a cross-check of a plan against the installed vLLM, and a plugin that makes
vLLM serve a reviewed artifact. Nothing here is imported by the compiler.
"""
