"""The serving-side half of kvspec: map an artifact onto memory, hand out blocks.

* ``loader`` — ``load(artifact, device=..., num_blocks=... | memory=...)``: one
  allocation per pool, one ``as_strided`` view per layer (imports torch);
* ``views`` — per-layer views, K/V splits, NHD/HND kernel conventions (torch);
* ``distributed`` — ranks agree on one block count and one source (torch);
* ``block_pool`` / ``hashing`` — the block pool and its prefix-cache hash keys (no torch).
"""
