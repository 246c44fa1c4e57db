"""The version of kvspec (a leaf module: everything may import it)."""

__version__ = "0.3.0"
