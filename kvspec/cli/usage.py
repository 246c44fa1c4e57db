"""click's usage errors as kvspec's: one message format for every error.

click finds what is wrong with a command line (an unknown option, a missing
argument, a value not among the choices); this module says it the way every
other kvspec error is said -- message, ``expected``, ``found`` and a hint --
so a usage error reads like an input error, on stderr or as JSON. An unknown
option gets a "did you mean" from the command's own options (vLLM's spellings
included), or names the command that has it.

>>> import click
>>> @click.command()
... @click.option("--memory")
... def plan(memory): ...
>>> ctx = click.Context(plan, info_name="plan")
>>> err = as_usage_error(click.NoSuchOption("--memroy", ctx=ctx), ["--memroy", "1GiB"])
>>> print(err.render())
kvspec: error: no such option: --memroy
  found: --memroy
  hint: did you mean --memory? (kvspec plan --help lists the options)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

import click

from kvspec.cli.commands import COMMANDS
from kvspec.errors import UsageError

__all__ = ["as_usage_error", "suggest"]


def _help(ctx: click.Context | None) -> str:
    path = ctx.command_path if ctx is not None else "kvspec"
    if not path.startswith("kvspec"):
        path = f"kvspec {path}"
    return f"{path} --help"


def _options(command: click.Command | None) -> list[str]:
    if command is None:
        return []
    return [o for p in command.params if isinstance(p, click.Option) and not p.hidden
            for o in (*p.opts, *p.secondary_opts)] + ["--help"]


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word``, if one is close (``-tp`` -> ``--tp`` too)."""
    candidates = list(dict.fromkeys(candidates))
    bare = {c.lstrip("-"): c for c in candidates}
    if word.lstrip("-") in bare:
        return bare[word.lstrip("-")]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def _typed(name: str, argv: Sequence[str]) -> str:
    """The option as typed: click reports ``-tp`` as ``-t`` (short options combined)."""
    for arg in argv:
        word = arg.split("=", 1)[0]
        if word == name:
            return word
    if len(name) == 2 and not name.startswith("--"):
        for arg in argv:
            if arg.startswith(name) and not arg.startswith("--"):
                return arg.split("=", 1)[0]
    return name


def _elsewhere(option: str, here: click.Command | None, ctx: click.Context | None
               ) -> str | None:
    """The other command that takes ``option``, e.g. ``--tp`` is ``init``'s (the
    commands of the group ``ctx`` belongs to)."""
    cli = ctx.find_root().command if ctx is not None else None
    if not isinstance(cli, click.Group):
        return None
    ctx = click.Context(cli, info_name="kvspec")
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        if command is not None and command is not here and option in _options(command):
            return name
    return None


def _no_such_option(exc: click.NoSuchOption, argv: Sequence[str]) -> UsageError:
    ctx = exc.ctx
    command = ctx.command if ctx is not None else None
    typed = _typed(exc.option_name, argv)
    near = suggest(typed, _options(command))
    if near is not None:
        hint = f"did you mean {near}? ({_help(ctx)} lists the options)"
    else:
        other = _elsewhere(typed, command, ctx)
        hint = (f"{typed} is an option of `kvspec {other}`; {_help(ctx)} lists this "
                "command's" if other else f"{_help(ctx)} lists the options")
    return UsageError(f"no such option: {typed}", found=typed, hint=hint)


def _bad_value(exc: click.BadParameter) -> UsageError:
    param = exc.param
    name = (param.get_error_hint(exc.ctx) if param is not None and exc.ctx is not None
            else "a value").replace("'", "")
    message = exc.message   # click's own words, without "Invalid value for ..."
    expected = found = None
    hint = f"{_help(exc.ctx)} says what it takes"
    if param is not None and isinstance(param.type, click.Choice):
        choices = [str(c) for c in param.type.choices]
        expected = "one of " + ", ".join(choices)
        value = message.split("'", 2)[1] if message.count("'") >= 2 else None
        found = value
        near = suggest(value, choices) if value else None
        if near is not None:
            hint = f"did you mean {near}?"
        message = f"invalid value for {name}: {value!r} is not a choice"
    else:
        message = f"invalid value for {name}: {message.rstrip('.')}"
    return UsageError(message, expected=expected, found=found, hint=hint)


def _missing(exc: click.MissingParameter) -> UsageError:
    param = exc.param
    ctx = exc.ctx
    usage = None
    if ctx is not None:
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
        if not usage.startswith("kvspec"):
            usage = f"kvspec {usage}"
    if param is not None and isinstance(param, click.Argument):
        what = f"missing argument {param.make_metavar(ctx) if ctx else param.name}"
    elif param is not None:
        what = f"missing option {param.opts[-1]}"
        if isinstance(param.type, click.Choice):
            usage = "one of " + ", ".join(map(str, param.type.choices))
    else:
        what = exc.format_message().rstrip(".")
    return UsageError(what, expected=usage, hint=f"{_help(ctx)} shows how to call it")


def as_usage_error(exc: click.ClickException, argv: Sequence[str] = ()) -> UsageError:
    """click's usage error ``exc`` as a kvspec :class:`UsageError` (exit 2)."""
    if isinstance(exc, click.NoSuchOption):
        return _no_such_option(exc, argv)
    if isinstance(exc, click.MissingParameter):
        return _missing(exc)
    if isinstance(exc, click.BadParameter):
        return _bad_value(exc)
    ctx = getattr(exc, "ctx", None)
    message = exc.format_message().rstrip(".")
    message = message[:1].lower() + message[1:]
    if message.startswith("no such command"):
        word = message.split("'")[1] if "'" in message else ""
        near = suggest(word, [m.rstrip("_").replace("_", "-") for m in COMMANDS])
        return UsageError(message, found=word or None,
                          hint=(f"did you mean {near}? " if near else "")
                          + "(kvspec --help lists the commands)")
    return UsageError(message, hint=f"{_help(ctx)} shows how to call it")
