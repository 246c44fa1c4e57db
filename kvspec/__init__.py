"""kvspec: declare, compile and load KV-cache memory layouts."""

__version__ = "0.1.0"
