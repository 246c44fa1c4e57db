"""The serving-side half of kvspec: map an artifact onto memory, hand out blocks.

``kvspec.runtime.loader`` imports torch; ``kvspec.runtime.block_pool`` does not.
"""
