"""kvspec's version: a leaf module, so every package can name it without importing
``kvspec`` (whose lazy attributes reach the compiler and the runtime)."""

__version__ = "0.3.0"
