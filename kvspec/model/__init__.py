"""The domain model: layer kinds and specs, quantization formats, dtypes, axis
orders, engine settings, affine byte forms, view geometry and the plan IR.

Nothing here imports torch, vLLM, the planner or the runtime.
"""
