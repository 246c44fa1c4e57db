"""CLI commands beyond compile/validate/plan/import, one module each (``command``)."""
