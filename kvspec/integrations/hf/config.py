"""Reading a Hugging Face ``config.json``, and placing what is wrong in it.

:func:`read_config` reads the file (an object, or a :class:`KvspecError` at the
file); :func:`config_error` turns the :class:`ConfigError` a family raised into
a :class:`KvspecError` at the value's line and column, with its path in the
config (``text_config.layer_types[3]``), what was expected and found, and a hint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvspec.errors import KvspecError, format_path
from kvspec.files import read_text
from kvspec.files import shown as shown_path
from kvspec.integrations.dump.jsontext import lenient_positions, unreadable_at
from kvspec.integrations.hf.families.facts import ConfigError, shown

__all__ = ["config_error", "read_config"]

_HINT = "give the model's Hugging Face config.json"


def read_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed ``config.json`` at ``path`` and its text; errors at the file.
    It is read as ``json`` (and ``transformers``) read it: NaN and Infinity are
    numbers, and of a key given twice the last counts."""
    file = shown_path(path)
    text = read_text(path, what="config.json", error=KvspecError, hint=_HINT)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        short = exc.pos >= len(text.rstrip())
        raise KvspecError(f"not valid JSON: {exc.msg}", file=file, line=exc.lineno,
                          column=exc.colno, hint="config.json is one JSON document"
                          + (": is the file empty or cut short?" if short else "")) from None
    except (RecursionError, ValueError):   # nested too deep, or an integer too long
        raise unreadable_at(text, file, "config.json", _HINT) or KvspecError(
            "not valid JSON", file=file, hint=_HINT) from None
    if not isinstance(data, dict):
        raise not_an_object(data, file)
    return data, text


def not_an_object(data: Any, file: str) -> KvspecError:
    return KvspecError("config.json must hold a JSON object", file=file, line=1, column=1,
                       expected='one JSON object: {"model_type": ..., "architectures": '
                       '[...], ...}', found=shown(data),
                       hint=_HINT + " (the file itself, not a list of them)")


def _prefix(config: Mapping[str, Any], exc: ConfigError) -> tuple[str | int, ...]:
    """Where in ``config`` the mapping ``exc`` was read from starts."""
    text = config.get("text_config")
    if exc.cfg is config:
        return ()
    if isinstance(text, Mapping) and (exc.cfg is text or exc.path[0] in text
                                      or exc.path[0] not in config):
        return ("text_config",)   # the text config, or a copy with defaults (Gemma 3)
    return ()


def config_error(exc: ConfigError, config: Mapping[str, Any], file: str,
                 text: str | None = None) -> KvspecError:
    """``exc`` as a :class:`KvspecError` in ``file``, at its line and column when
    ``text`` (the file's) is given."""
    path = _prefix(config, exc) + exc.path
    doc = lenient_positions(text, file) if text is not None else None
    line, column = (doc.position(path) if doc is not None else None) or (None, None)
    return KvspecError(exc.message, file=file, line=line, column=column,
                       path=format_path(path), expected=exc.expected, found=exc.found,
                       hint=exc.hint)
