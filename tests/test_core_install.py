"""The main job runs on the core install alone (the README's first command).

CI runs that command verbatim in a fresh venv; this test fails sooner, in the suite:
the commands a new user runs first are run with every package that only an extra
brings made unimportable.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Packages that only an extra (runtime, test, vllm, nixl, ray) brings.
EXTRAS_ONLY = ("orjson", "cbor2", "xxhash", "numpy", "torch", "jsonschema", "hypothesis",
               "ray", "nixl", "vllm", "sglang")


def test_the_main_commands_need_no_extra(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        for name in {EXTRAS_ONLY!r}:
            sys.modules[name] = None  # `import name` raises ImportError
        from kvspec.cli import main
        commands = [
            ["compile", "layouts/llama-3.1-8b.yaml", "-o", {str(tmp_path / "l.json")!r}],
            ["validate", "layouts/pooling-auto.yaml"],
            ["plan", "layouts/pooling-separate.yaml"],
            ["trace", "-n", "20", "-o", {str(tmp_path / "t.jsonl")!r}],
            ["simulate", "layouts/llama-3.1-8b.kvlayout.json", "--workload",
             {str(tmp_path / "t.jsonl")!r}],
            ["explain", "layouts/gemma-2-9b-it.yaml", "-o", {str(tmp_path / "r.html")!r}],
            ["descriptor", "layouts/llama-3.1-8b.kvlayout.json"],
        ]
        for argv in commands:
            try:
                main(argv)
            except SystemExit as stop:
                if stop.code:
                    raise SystemExit(f"{{argv}}: exit {{stop.code}}")
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
