"""kvspec's build: the package (``pyproject.toml``), and the simulator's hot modules
compiled with mypyc where that works (``kvspec/_native.py`` lists them and says when
the compiled build is used). Without mypyc or a C compiler, or with
``KVSPEC_PURE_PYTHON`` set, kvspec installs as pure Python, and runs the same."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE: dict = {"__file__": str(HERE / "kvspec" / "_native.py")}
exec(compile((HERE / "kvspec" / "_native.py").read_text(), "kvspec/_native.py", "exec"), NATIVE)
MODULES = NATIVE["MODULES"]


def say(text: str) -> None:
    print(f"kvspec setup: {text}", file=sys.stderr)


def native_extensions() -> list:
    if os.environ.get("KVSPEC_PURE_PYTHON", "") not in ("", "0"):
        say("KVSPEC_PURE_PYTHON is set: pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        say("mypyc is not installed: pure Python")
        return []
    paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in MODULES]
    try:
        # mypy's own settings (an empty config: the project's pydantic plugin is not
        # in the build environment, and compiling needs no stricter checks)
        extensions = mypycify(["--config-file", str(HERE / "setup_mypyc.ini"), *paths],
                              opt_level="3", target_dir="build/mypyc",
                              group_name="kvspec.native")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure: pure Python
        say(f"mypyc could not compile ({exc}): pure Python")
        return []
    for extension in extensions:
        extension.optional = True  # a C compiler's failure leaves pure Python
    return extensions


class BuildExt(build_ext):
    """Records the compiled modules' sources (``_native.json``, beside the built
    ``kvspec`` package) once all of them are built."""

    def run(self) -> None:
        if not self.extensions:  # nothing to compile: another build's record stays
            super().run()
            return
        built = [Path(self.get_ext_fullpath(e.name)) for e in self.extensions]
        package = Path(self.get_ext_fullpath("kvspec.sim.schedule")).parents[1]
        (package / NATIVE["MANIFEST"]).unlink(missing_ok=True)
        super().run()
        if all(p.exists() for p in built):
            digests = {m: NATIVE["source_digest"](HERE / Path(*m.split(".")).with_suffix(".py"))
                       for m in MODULES}
            (package / NATIVE["MANIFEST"]).write_text(json.dumps(digests, indent=1,
                                                                 sort_keys=True) + "\n")
            say(f"compiled {len(MODULES)} modules with mypyc ({package})")
        else:
            say("a compiled module failed to build: pure Python")


setup(ext_modules=native_extensions(), cmdclass={"build_ext": BuildExt})
