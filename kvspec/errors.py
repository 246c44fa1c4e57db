"""The one error family of kvspec.

Every problem a user can cause is a :class:`KvspecError`. It carries where the
problem is (file, line, column, the path into the YAML), what was expected,
what was found and a hint. Errors are values: once made they do not change;
:meth:`KvspecError.at` and :meth:`KvspecError.replace` return new ones. Exit
codes belong to the error classes, and the CLI turns errors into messages and
exits in one place (:func:`kvspec.cli.main`).

>>> err = KvspecError("block_size must be a power of two", file="m.yaml", line=3,
...                   column=15, path="engine.block_size", expected="16, 32, 64, ...",
...                   found="24", hint="use 16 unless your backend needs more")
>>> print(err.render())
m.yaml:3:15: error: block_size must be a power of two
  at: engine.block_size
  expected: 16, 32, 64, ...
  found: 24
  hint: use 16 unless your backend needs more
>>> err.at(Location("other.yaml", 9, 1)).file, err.file     # a new error; the old one stays
('m.yaml', 'm.yaml')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

#: Exit codes, by error type (``click`` convention: 2 is a usage error).
EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def format_path(path: Sequence[str | int]) -> str:
    """A value's path as errors show it: ``("layers", 2, "pattern", 0)`` ->
    ``layers[2].pattern[0]`` (of a source, a dump or an artifact alike)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a source file: 1-based line and column, and the YAML path
    (:func:`format_path`)."""

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

    def under(self, outer: Location) -> Location:
        """This location, its missing parts taken from ``outer``."""
        return Location(self.file or outer.file,
                        self.line if self.line is not None else outer.line,
                        self.column if self.column is not None else outer.column,
                        self.path or outer.path)


class Ref(Protocol):
    """What an error is about, in the words of the code that found it (a layer by
    name, an engine setting by its field), for the source layer to locate at a
    file, line and column (:mod:`kvspec.source.where`) once."""

    def shown(self) -> str | None:
        """How the element is named where it cannot be located in a file."""
        ...


@dataclass(frozen=True, slots=True)
class LayerRef:
    """A layer, by name: located at the source entry that made it."""

    name: str

    def shown(self) -> str | None:
        return None


class KvspecError(Exception):
    """A problem with the user's input, reported with its position and a hint."""

    exit_code: ClassVar[int] = EXIT_INVALID

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, path: str | None = None,
                 expected: str | None = None, found: str | None = None,
                 hint: str | None = None, ref: Ref | None = None) -> None:
        super().__init__(message)
        self._set(message=message, location=Location(file, line, column, path),
                  expected=expected, found=found, hint=hint, ref=ref)

    def _set(self, **fields: Any) -> None:
        """Give the fields their values, once, while the error is made: a subclass
        declares its own fields with their types and sets them here too."""
        self.__dict__.update(fields)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__"):  # tracebacks, causes and notes
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace()")

    # -- what the error says -------------------------------------------------
    message: str
    location: Location
    expected: str | None
    found: str | None
    hint: str | None
    #: What the problem is about, until the source layer locates it (:class:`Ref`).
    ref: Ref | None

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
        """The path of the location, or how :attr:`ref` names the element."""
        if self.location.path is None and self.ref is not None:
            return self.ref.shown()
        return self.location.path

    @property
    def layer(self) -> str | None:
        """The layer the problem is about, if it is about one."""
        return self.ref.name if isinstance(self.ref, LayerRef) else None

    # -- new errors from this one ----------------------------------------------
    def replace(self, **changes: Any) -> KvspecError:
        """A copy with ``changes`` (``message``, ``location``, ``hint``, ...)."""
        new = type(self).__new__(type(self))
        Exception.__init__(new, changes.get("message", self.message))
        new.__dict__.update({**self.__dict__, **changes})
        return new

    def at(self, location: Location) -> KvspecError:
        """This error placed at ``location`` where it had no place yet."""
        return self.replace(location=self.location.under(location))

    def as_type(self, cls: type[KvspecError]) -> KvspecError:
        """The same error as an instance of ``cls`` (e.g. for another exit code)."""
        new = cls.__new__(cls)
        Exception.__init__(new, self.message)
        new.__dict__.update(self.__dict__)
        return new

    # -- rendering ---------------------------------------------------------------
    def render(self) -> str:
        """The message as printed; control characters from the input are escaped
        (``\\x00``), so a message never rewrites the terminal."""
        lines = [f"{self.location.prefix()}: error: {self.message}"]
        if self.path:
            lines.append(f"  at: {self.path}")
        if self.expected is not None:
            lines.append(f"  expected: {self.expected}")
        if self.found is not None:
            lines.append(f"  found: {self.found}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(_UNPRINTABLE.sub(_escape, line) for line in lines)

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), dict(self.__dict__)))

    def as_dict(self) -> dict[str, object]:
        return {"type": type(self).__name__, "message": self.message, "file": self.file,
                "line": self.line, "column": self.column, "path": self.path,
                "expected": self.expected, "found": self.found, "hint": self.hint}


#: Characters a message must not print as they are: C0/C1 controls (but the
#: newline between a message's lines), lone surrogates, zero-width and bidirectional
#: marks, line and paragraph separators, byte-order marks.
_UNPRINTABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200b-\u200f"
                          "\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match[str]) -> str:
    return m.group().encode("unicode_escape", "backslashreplace").decode("ascii") \
        if not "\ud800" <= m.group() <= "\udfff" else f"\\u{ord(m.group()):04x}"


def _rebuild(cls: type[KvspecError], state: dict[str, Any]) -> KvspecError:
    new = cls.__new__(cls)
    Exception.__init__(new, state.get("message", ""))
    new.__dict__.update(state)
    return new


class SourceError(KvspecError):
    """The YAML source is malformed or does not match the schema."""


class PlanError(KvspecError):
    """The layers cannot be planned the way the reference planner plans them."""


#: The hint of a check that guards kvspec's own planning: no source should reach it.
PLANNER_BUG = ("kvspec planned something it cannot lay out: please report it with the "
               "source and `kvspec --version`")


class NotEnoughMemoryError(PlanError):
    """One request at ``max_model_len`` does not fit the memory budget.

    >>> err = NotEnoughMemoryError("no room", needed_bytes=2, available_bytes=1,
    ...                            max_model_len=8, estimated_max_model_len=4, hint="...")
    >>> err.estimated_max_model_len, err.replace(hint="more memory").needed_bytes
    (4, 2)
    """

    needed_bytes: int
    available_bytes: int
    max_model_len: int
    #: The longest length that fits.
    estimated_max_model_len: int

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int,
                 max_model_len: int, estimated_max_model_len: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self._set(needed_bytes=needed_bytes, available_bytes=available_bytes,
                  max_model_len=max_model_len, estimated_max_model_len=estimated_max_model_len)


class ArtifactError(KvspecError):
    """A layout artifact is corrupt, stale or from an incompatible compiler."""


class UsageError(KvspecError):
    """The command line itself is wrong."""

    exit_code = EXIT_USAGE


class ErrorList(KvspecError):
    """Several problems found together; validation reports all of them at once."""

    errors: tuple[KvspecError, ...]

    def __init__(self, errors: Iterable[KvspecError]) -> None:
        errors = tuple(errors)
        first = errors[0]
        super().__init__(first.message if len(errors) == 1 else f"{len(errors)} problems found",
                         file=first.file)
        self._set(errors=tuple(errors))

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return max(e.exit_code for e in self.errors)

    def render(self) -> str:
        return "\n".join(err.render() for err in self.errors)

    def as_dict(self) -> dict[str, object]:
        return {"type": "ErrorList", "errors": [e.as_dict() for e in self.errors]}


def raise_all(errors: Iterable[KvspecError]) -> None:
    """Raise the collected errors as one, or do nothing when there are none."""
    unique: dict[str, KvspecError] = {}
    for err in errors:
        unique.setdefault(err.render(), err)
    found = list(unique.values())
    if len(found) == 1:
        raise found[0]
    if found:
        raise ErrorList(found)
