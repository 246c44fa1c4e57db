"""``kvspec check``: every committed artifact is what its source compiles to.

Like a lock-file check, for CI and pre-commit (``.pre-commit-hooks.yaml``): an
artifact ``X.kvlayout.json`` lives beside its source ``X.yaml``; compiling is
deterministic, so the check recompiles each source in memory and compares the
bytes. Problems, each on its own line:

* ``stale``: the artifact differs from what the source compiles to now;
* ``missing``: a source without its artifact;
* ``orphaned``: an artifact without its source;
* ``invalid``: a source that does not compile.

``--fix`` rewrites stale artifacts and writes missing ones; orphaned artifacts
and invalid sources need a person.

>>> [f.status for f in check_paths(["layouts/llama-3.1-8b.yaml"])]
['current']
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import click

from kvspec._version import __version__
from kvspec.artifact.text import sha256_of as sha256_text
from kvspec.cli.common import USAGE, echo_json, format_option, quiet_option
from kvspec.cli.common import command as cli_command
from kvspec.errors import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    ArtifactError,
    KvspecError,
    UsageError,
)
from kvspec.files import is_stdin, write_atomic

Status = Literal["current", "stale", "missing", "orphaned", "invalid", "fixed"]

_SOURCE_SUFFIXES = (".yaml", ".yml")
_ARTIFACT_SUFFIX = ".kvlayout.json"
#: What check takes (its paths' hint).
_WHAT = ("give layout sources (X.yaml), artifacts (X.kvlayout.json) or directories "
         "holding them")


@dataclass(frozen=True)
class Finding:
    """The state of one source/artifact pair."""

    source: Path | None
    artifact: Path
    status: Status
    detail: str = ""
    #: The artifact text the source compiles to (for ``--fix``).
    expected: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("current", "fixed")

    def as_dict(self) -> dict[str, object]:
        return {"source": str(self.source) if self.source else None,
                "artifact": str(self.artifact), "status": self.status, "detail": self.detail}

    def line(self) -> str:
        where = self.source if self.status == "invalid" else self.artifact
        return f"{where}: {self.status}" + (f": {self.detail}" if self.detail else "")


class StaleArtifactError(ArtifactError):
    """Committed artifacts are not what their sources compile to."""


def artifact_path(source: Path) -> Path:
    """``X.yaml`` -> ``X.kvlayout.json`` beside it."""
    name = source.name
    for suffix in _SOURCE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return source.with_name(name + _ARTIFACT_SUFFIX)


def _source_for(artifact: Path) -> Path | None:
    stem = artifact.name[: -len(_ARTIFACT_SUFFIX)]
    for suffix in _SOURCE_SUFFIXES:
        candidate = artifact.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def _is_layout_source(path: Path) -> bool:
    """A YAML file in a directory is a layout source when it declares ``kvspec:``
    (other YAML, e.g. ``.pre-commit-config.yaml``, is not ours to check)."""
    try:
        head = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(line.startswith("kvspec:") for line in head.splitlines())


def _pairs(paths: Iterable[str | Path]) -> list[tuple[Path | None, Path]]:
    """``(source, artifact)`` pairs named by files or found in directories."""
    pairs: dict[Path, Path | None] = {}
    for raw in paths:
        path = Path(raw)
        if is_stdin(path):
            raise UsageError("check takes files, not stdin (-): it compares each source "
                             "with the artifact beside it", found="-",
                             hint="give the source's path, or check a piped source with "
                             "`kvspec validate -`")
        if path.is_dir():
            for source in sorted(p for p in path.iterdir()
                                 if p.is_file() and p.name.endswith(_SOURCE_SUFFIXES)
                                 and _is_layout_source(p)):
                pairs[artifact_path(source)] = source
            for art in sorted(path.glob("*" + _ARTIFACT_SUFFIX)):
                pairs.setdefault(art, _source_for(art))
        elif path.name.endswith(_ARTIFACT_SUFFIX):
            beside = _source_for(path)
            if beside is None and not path.exists():
                raise KvspecError("no such artifact, and no source beside it", file=str(path),
                                  hint="compile its source first (kvspec compile X.yaml), "
                                  "or give the directory holding both")
            pairs.setdefault(path, beside)
        elif path.name.endswith(_SOURCE_SUFFIXES):
            if not path.is_file():
                raise KvspecError("no such file", file=str(path), hint=_WHAT)
            pairs[artifact_path(path)] = path
        elif not path.exists():
            raise KvspecError("no such file or directory", file=str(path), hint=_WHAT)
        else:
            raise UsageError(f"{path} is neither a layout source (.yaml) nor an artifact "
                             f"({_ARTIFACT_SUFFIX})", file=str(path), hint=_WHAT)
    return sorted(((s, a) for a, s in pairs.items()), key=lambda p: str(p[1]))


def check_pair(source: Path | None, artifact: Path) -> Finding:
    """Recompile ``source`` in memory and compare with the committed ``artifact``."""
    # deferred: the compiler and reports (pydantic, PyYAML) load when the command runs
    from kvspec.compiler import compile_source, read_source

    if source is None:
        return Finding(None, artifact, "orphaned",
                       "no source beside it (X.yaml for X.kvlayout.json); delete it or "
                       "restore its source")
    try:
        text = read_source(source)
        expected = compile_source(text, str(source)).text()
    except KvspecError as err:
        first = err.render().splitlines()[0]
        return Finding(source, artifact, "invalid", f"does not compile: {first}")
    if not artifact.exists():
        return Finding(source, artifact, "missing", f"compile {source}", expected)
    try:
        current = artifact.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Finding(source, artifact, "stale", f"not a readable artifact ({exc})", expected)
    if current == expected:
        return Finding(source, artifact, "current")
    return Finding(source, artifact, "stale", _why_stale(current, text, source), expected)


def _why_stale(current: str, source_text: str, source: Path) -> str:
    try:
        data = json.loads(current)
        compiled_from = data["source_sha256"]
        compiler = data["compiler"]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: too deep
        return "not a readable artifact"
    if compiled_from != sha256_text(source_text):
        return f"{source} changed since it was compiled"
    if compiler != f"kvspec {__version__}":
        return f"compiled by {compiler}; this is kvspec {__version__}"
    return ("the plan differs from what this compiler makes of the same source "
            "(compiled with --memory, or edited by hand?)")


def check_paths(paths: Iterable[str | Path]) -> list[Finding]:
    """Check every source/artifact pair under ``paths`` (files or directories)."""
    return [check_pair(source, artifact) for source, artifact in _pairs(paths)]


def fix(findings: list[Finding]) -> list[Finding]:
    """Write the expected artifact for every stale or missing pair."""
    out = []
    for f in findings:
        if f.status in ("stale", "missing") and f.expected is not None:
            write_atomic(f.artifact, f.expected)
            out.append(replace(f, status="fixed",
                               detail=f"rewrote it from {f.source} (was {f.status})"))
        else:
            out.append(f)
    return out


@cli_command("check", short_help="Check that committed artifacts are current.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--fix", "do_fix", is_flag=True,
              help="Rewrite stale artifacts and write missing ones.")
@click.option("-v", "--verbose", is_flag=True, help="List current artifacts too.")
@format_option("text", "json", help="json: every finding as an object on stdout "
               "(docs/cli.md).")
@quiet_option
def command(paths: tuple[Path, ...], do_fix: bool, verbose: bool, fmt: str,
            quiet: bool) -> int:
    """Check that each committed artifact is what its source compiles to.

    PATHS are sources, artifacts or directories (default: layouts/). Exit 0
    when every artifact is current, 1 when any is stale, missing or orphaned,
    a source does not compile, or there is nothing to check.
    """
    findings = check_paths(paths or (Path("layouts"),))
    if not findings:
        raise KvspecError("no layout sources or artifacts to check",
                          file=", ".join(map(str, paths)) or "layouts",
                          hint="give a directory holding X.yaml sources (with `kvspec: 1`) "
                               "and their X.kvlayout.json artifacts")
    if do_fix:
        findings = fix(findings)
    if fmt == "json":
        echo_json({"ok": all(f.ok for f in findings), "findings": [f.as_dict() for f in findings]})
    else:
        for f in findings:
            if (verbose or f.status != "current") and not (quiet and f.ok):
                click.echo(f.line())
    bad = [f for f in findings if not f.ok]
    if not bad:
        fixed = sum(f.status == "fixed" for f in findings)
        if fmt == "text" and not quiet:
            click.echo(f"{len(findings)} artifact(s) checked: all current"
                       + (f" ({fixed} rewritten)" if fixed else ""))
        return EXIT_OK
    if fmt == "json":  # the findings say it, in the one document stdout holds
        return EXIT_INVALID
    raise _not_current(bad, findings, paths)


def _not_current(bad: list[Finding], findings: list[Finding],
                 paths: tuple[Path, ...]) -> StaleArtifactError:
    counts: dict[str, int] = {}
    for f in bad:
        counts[f.status] = counts.get(f.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    fixable = any(f.status in ("stale", "missing") for f in bad)
    return StaleArtifactError(
        f"{len(bad)} of {len(findings)} artifact(s) not current: {summary}",
        file=", ".join(str(p) for p in paths) or "layouts",
        hint=f"run `{' '.join(['kvspec check --fix', *map(str, paths)])}` (or `kvspec "
        "compile SOURCE`) and commit the result"
        if fixable else "delete orphaned artifacts or restore their sources; fix sources "
        "that do not compile")


#: ``kvspec check``'s exit codes and what each means (docs/cli.md).
EXITS = (
    (EXIT_OK, "every artifact is current (after `--fix`: current or rewritten)"),
    (EXIT_INVALID, ("an artifact is stale, missing or orphaned, a source does not "
                    "compile, a path does not exist, or there is nothing to check")),
    (EXIT_USAGE, USAGE + "; a path that is neither a `.yaml` source nor a "
                 "`.kvlayout.json` artifact"),
)
#: Pages to read next (docs/cli.md).
SEE_ALSO = ("getting-started.md",)
