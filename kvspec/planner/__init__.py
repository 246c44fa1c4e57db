"""Compiler passes: grouping, placement and sizing of KV-cache layers."""
