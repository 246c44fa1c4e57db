"""Hugging Face ``config.json`` import helpers (torch-free)."""
