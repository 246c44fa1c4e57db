"""The command modules, in the order ``kvspec --help`` lists them: a leaf module,
so the package (:mod:`kvspec.cli`) and the click group (:mod:`kvspec.cli.app`) both
name them without importing each other."""

COMMANDS = ("compile", "validate", "plan", "import_", "explain", "diff", "check", "schema",
            "init", "verify", "engine_args", "descriptor", "transfer", "simulate",
            "profile", "trace", "sweep")
