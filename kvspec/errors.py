"""The one error family of kvspec.

Every problem a user can cause is a :class:`KvspecError`. It carries where the
problem is (file, line, column, the path into the YAML), what was expected, what
was found and a hint. The CLI turns it into a message and an exit code in one
place (:mod:`kvspec.cli`); nothing else calls ``sys.exit``.

>>> err = KvspecError("block_size must be a power of two", file="m.yaml", line=3,
...                   column=15, path="engine.block_size", expected="16, 32, 64, ...",
...                   found="24", hint="use 16 unless your backend needs more")
>>> print(err.render())
m.yaml:3:15: error: block_size must be a power of two
  at: engine.block_size
  expected: 16, 32, 64, ...
  found: 24
  hint: use 16 unless your backend needs more
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Exit codes, by error type (``click`` convention: 2 is a usage error).
EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a source file: 1-based line and column, and the YAML path."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str | None = None

    def prefix(self) -> str:
        if self.file is None and self.line is None:
            return "kvspec"
        parts = [self.file or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


class KvspecError(Exception):
    """A problem with the user's input, reported with its position and a hint."""

    exit_code = EXIT_INVALID

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        path: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.location = Location(file, line, column, path)
        self.expected = expected
        self.found = found
        self.hint = hint

    @property
    def file(self) -> str | None:
        return self.location.file

    @property
    def line(self) -> int | None:
        return self.location.line

    @property
    def column(self) -> int | None:
        return self.location.column

    @property
    def path(self) -> str | None:
        return self.location.path

    def at(self, location: Location) -> KvspecError:
        """Return this error placed at ``location`` where it had no place yet."""
        mine = self.location
        self.location = Location(
            mine.file or location.file,
            mine.line if mine.line is not None else location.line,
            mine.column if mine.column is not None else location.column,
            mine.path or location.path,
        )
        return self

    def render(self) -> str:
        lines = [f"{self.location.prefix()}: error: {self.message}"]
        if self.location.path:
            lines.append(f"  at: {self.location.path}")
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found: {self.found}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def as_dict(self) -> dict[str, object]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            "path": self.location.path,
            "expected": self.expected,
            "found": self.found,
            "hint": self.hint,
        }


class SourceError(KvspecError):
    """The YAML source is malformed or does not match the schema."""


class PlanError(KvspecError):
    """The layers cannot be planned the way the reference planner plans them."""


class UnsupportedError(PlanError):
    """The reference planner supports this, kvspec does not (yet)."""


class NotEnoughMemoryError(PlanError):
    """One request at ``max_model_len`` does not fit the memory budget."""

    def __init__(
        self,
        message: str,
        *,
        needed_bytes: int,
        available_bytes: int,
        max_model_len: int,
        estimated_max_model_len: int,
        **kwargs: object,
    ) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.max_model_len = max_model_len
        self.estimated_max_model_len = estimated_max_model_len


class ArtifactError(KvspecError):
    """A layout artifact is corrupt, stale or from an incompatible compiler."""


class UsageError(KvspecError):
    """The command line itself is wrong."""

    exit_code = EXIT_USAGE


class ErrorList(KvspecError):
    """Several problems found together; validation reports all of them at once."""

    def __init__(self, errors: Sequence[KvspecError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(
            first.message if len(self.errors) == 1 else f"{len(self.errors)} problems found",
            file=first.file,
        )

    def render(self) -> str:
        return "\n".join(err.render() for err in self.errors)

    def as_dict(self) -> dict[str, object]:
        return {"type": "ErrorList", "errors": [e.as_dict() for e in self.errors]}


def raise_all(errors: Iterable[KvspecError]) -> None:
    """Raise the collected errors as one, or do nothing when there are none."""
    unique: dict[str, KvspecError] = {}
    for err in errors:
        unique.setdefault(err.render(), err)
    errors = list(unique.values())
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ErrorList(errors)
