"""Connectors: moving KV blocks between deployments and tiers.

- :mod:`kvspec.connectors.plan` -- :class:`TransferPlan`, which bytes of one
  deployment's cache move to which bytes of another's, per block (torch-free);
- :mod:`kvspec.connectors.nixl` -- executes a plan between NIXL agents (the
  optional extra ``pip install 'kvspec[nixl]'``; NIXL is imported only when used).
"""
