"""Generate the CLI reference (``docs/cli.md``) from the click commands.

Every command's usage, help text, arguments and options come from its click
definition, so the reference cannot drift from ``kvspec COMMAND --help``;
what click does not know (exit codes, related pages) is data in this module.
Regenerate the page with::

    python -m kvspec.cli_docs > docs/cli.md

(or ``KVSPEC_REGEN=1 python -m pytest tests/test_cli_docs.py``; the test fails
when the committed page is stale). The output depends only on the command
definitions, not on the click version or the terminal width.

>>> page = render()
>>> page.splitlines()[0]
'# Command-line reference'
>>> "## `kvspec compile`" in page and "| `--memory` |" in page
True
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import click

from kvspec.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE

#: The order commands appear in: the order a new user meets them. Commands not
#: listed here (a new module under ``kvspec/commands``) follow, alphabetically.
ORDER = ("init", "validate", "compile", "plan", "explain", "diff", "check", "schema",
         "import")

_USAGE = "a usage error: an unknown option, a missing argument, a bad value"
_DEFAULT_EXITS = (
    (EXIT_OK, "success"),
    (EXIT_INVALID, "invalid input: the message names the file, line and column, the YAML "
                   "path, what was expected and found, and a hint"),
    (EXIT_USAGE, _USAGE),
)


def _exit_codes() -> dict[str, tuple[tuple[int, str], ...]]:
    from kvspec.diff import EXIT_DIFFER

    return {
        "init": (
            (EXIT_OK, "the source was written (or printed)"),
            (EXIT_INVALID, "the config.json cannot be read, or its architecture is not "
                           "a supported family (the message lists them)"),
            (EXIT_USAGE, _USAGE + "; the output file exists and `--force` was not given"),
        ),
        "validate": (
            (EXIT_OK, "every source is valid"),
            (EXIT_INVALID, "a source has problems (all problems of a file are reported "
                           "together); the sources after it are not checked"),
            (EXIT_USAGE, _USAGE),
        ),
        "compile": (
            (EXIT_OK, "the artifact was written"),
            (EXIT_INVALID, "the source is invalid or cannot be planned (e.g. one request "
                           "at `max_model_len` does not fit `--memory`); nothing is written"),
            (EXIT_USAGE, _USAGE),
        ),
        "plan": (
            (EXIT_OK, "the plan was printed (a sweep is printed even when some budgets "
                      "cannot serve one request: those rows say so)"),
            (EXIT_INVALID, "the source is invalid, there is no budget (no `--memory`, "
                           "`--num-blocks` or `engine.memory`), or the budget cannot serve "
                           "one request; with `--json` the error is printed as JSON too"),
            (EXIT_USAGE, _USAGE),
        ),
        "explain": (
            (EXIT_OK, "the report was printed or written (a budget too small for one "
                      "request still gets a report, with a warning)"),
            (EXIT_INVALID, "the layout does not exist, does not compile, or is a tampered "
                           "artifact"),
            (EXIT_USAGE, _USAGE),
        ),
        "diff": (
            (EXIT_OK, "the plans are identical"),
            (EXIT_DIFFER, "the plans differ (nothing is printed on stderr)"),
            (EXIT_USAGE, "an error: a bad command line, or a side that does not load or "
                         "compile (never 1, so CI does not read a broken layout as a change)"),
        ),
        "check": (
            (EXIT_OK, "every artifact is current (after `--fix`: current or rewritten)"),
            (EXIT_INVALID, "an artifact is stale, missing or orphaned, a source does not "
                           "compile, or a path does not exist"),
            (EXIT_USAGE, _USAGE + "; a path that is neither a `.yaml` source nor a "
                         "`.kvlayout.json` artifact"),
        ),
        "schema": (
            (EXIT_OK, "the schemas were written, or (with `--check`) are current"),
            (EXIT_INVALID, "with `--check`: a schema file is stale or missing"),
            (EXIT_USAGE, _USAGE),
        ),
        "import": (
            (EXIT_OK, "the source was written (or printed)"),
            (EXIT_INVALID, "the dump cannot be read, is not a per-layer spec dump, or does "
                           "not plan"),
            (EXIT_USAGE, _USAGE + "; the output file exists and `--force` was not given"),
        ),
    }


#: Pages to read next, per command.
SEE_ALSO = {
    "init": ("getting-started.md", "format.md"),
    "validate": ("format.md",),
    "compile": ("format.md", "concepts.md"),
    "plan": ("concepts.md", "cookbook.md"),
    "explain": ("reports.md",),
    "diff": ("reports.md",),
    "check": ("getting-started.md",),
    "schema": ("format.md",),
    "import": ("format.md", "cookbook.md"),
}

_PREAMBLE = """\
# Command-line reference

<!-- Generated by `python -m kvspec.cli_docs > docs/cli.md` from the click commands.
     Do not edit by hand: tests/test_cli_docs.py fails when this page is stale. -->

`kvspec COMMAND --help` prints the same usage and options in a terminal. For a first
walk through the commands, see [getting-started.md](getting-started.md).

    kvspec [--version] [-h | --help] COMMAND [ARGS]...

| command | what it does |
| --- | --- |
{summary}

## Conventions

* **Exit codes.** 0 ok, 1 invalid input, 2 usage error, unless a command's table below
  says otherwise (`kvspec diff`: 1 means "the plans differ"; `kvspec check`: 1 means an
  artifact is stale). Errors go to stderr, results to stdout.
* **Error messages** name the file, line and column, the path into the YAML, what was
  expected, what was found and a hint:

      layouts/m.yaml:6:3: error: unknown field 'max_num_seq'
        at: engine.max_num_seq
        expected: one of async_scheduling, block_size, ...
        hint: did you mean 'max_num_seqs'?

* **Sizes** (`--memory`): bytes (`42949672960`) or a size with a unit: `40GiB`,
  `512MiB` (powers of two), `80GB` (powers of ten). `kvspec plan` also takes a sweep,
  `20GiB..80GiB` (seven budgets) or `20GiB..80GiB:10GiB` (a step).
* **Layouts** are sources (`X.yaml`, compiled on the fly) or artifacts
  (`X.kvlayout.json`, verified against their hash) wherever a command says LAYOUT;
  a source's artifact lives beside it as `X.kvlayout.json`.
* Files written with `-o` are written atomically: a reader never sees half a file.
"""


@dataclass(frozen=True)
class _Row:
    names: str
    value: str
    default: str
    help: str


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _help_paragraphs(text: str) -> list[str]:
    """click's help text as paragraphs: lines rewrapped, ``\\b`` blocks kept."""
    text = inspect.cleandoc(text).split("\f", 1)[0]
    out = []
    for para in text.split("\n\n"):
        if para.startswith("\b\n"):
            out.append("\n".join("    " + line for line in para[2:].splitlines()))
        elif para.strip():
            out.append(" ".join(para.split()))
    return out


def _type_name(param: click.Parameter) -> str:
    t = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(t, click.Choice):
        return " \\| ".join(f"`{c}`" for c in t.choices)
    if isinstance(t, click.Path):
        if not t.file_okay:
            return "DIRECTORY"
        return "FILE" if not t.dir_okay else "PATH"
    if isinstance(t, click.IntRange):
        bounds = []
        if t.min is not None:
            bounds.append(f"≥ {t.min}" if not t.min_open else f"> {t.min}")
        if t.max is not None:
            bounds.append(f"≤ {t.max}" if not t.max_open else f"< {t.max}")
        return "INTEGER " + ", ".join(bounds)
    return {"integer": "INTEGER", "text": "TEXT", "float": "FLOAT",
            "boolean": "BOOLEAN"}.get(t.name, t.name.upper())


#: click >= 8.3 marks "no default" with a sentinel instead of None.
_UNSET = getattr(click.core, "UNSET", None)


def _default(param: click.Option, ctx: click.Context) -> str:
    if param.is_flag or param.required:
        return ""
    value = param.get_default(ctx, call=False)
    if value is None or value is _UNSET or callable(value) or value == ():
        return ""
    return f"`{value}`"


def _option_rows(command: click.Command, ctx: click.Context) -> list[_Row]:
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
        names += param.secondary_opts
        help_text = param.help or ""
        if param.required:
            help_text = "Required. " + help_text
        rows.append(_Row(", ".join(f"`{n}`" for n in names), _type_name(param),
                         _default(param, ctx), help_text))
    return rows


def _usage(command: click.Command, name: str) -> str:
    pieces = [f"kvspec {name}", "[OPTIONS]"]  # -h/--help always exists
    for param in command.params:
        if not isinstance(param, click.Argument):
            continue
        metavar = (param.metavar or param.name or "").upper()
        if param.nargs == -1:
            pieces.append(f"{metavar}..." if param.required else f"[{metavar}]...")
        else:
            pieces.append(metavar if param.required else f"[{metavar}]")
    return " ".join(pieces)


def _arguments(command: click.Command) -> list[str]:
    lines = []
    for param in command.params:
        if not isinstance(param, click.Argument):
            continue
        metavar = (param.metavar or param.name or "").upper()
        if param.nargs == -1:
            count = "one or more" if param.required else "any number"
        else:
            count = "one" if param.required else "optional"
        lines.append(f"| `{metavar}` | {_type_name(param)} | {count} |")
    return lines


def _first_sentence(command: click.Command) -> str:
    paragraphs = _help_paragraphs(command.help or "")
    if not paragraphs:
        return ""
    first = paragraphs[0]
    end = first.find(". ")
    return first if end < 0 else first[: end + 1]


def commands(group: click.Group | None = None) -> list[tuple[str, click.Command]]:
    """The CLI's commands, in documentation order."""
    if group is None:
        from kvspec.cli import cli as group
    names = sorted(group.commands, key=lambda n: (ORDER.index(n) if n in ORDER
                                                  else len(ORDER), n))
    return [(n, group.commands[n]) for n in names]


def exit_codes(name: str) -> tuple[tuple[int, str], ...]:
    """The exit codes of ``kvspec NAME`` and what each means."""
    return _exit_codes().get(name, _DEFAULT_EXITS)


def _command_section(name: str, command: click.Command, group: click.Group) -> list[str]:
    parent = click.Context(group, info_name="kvspec", **group.context_settings)
    ctx = click.Context(command, info_name=name, parent=parent, **command.context_settings)
    out = [f"## `kvspec {name}`", "", "```text", _usage(command, name), "```", ""]
    for para in _help_paragraphs(command.help or ""):
        out += [para, ""]
    args = _arguments(command)
    if args:
        out += ["| argument | value | how many |", "| --- | --- | --- |", *args, ""]
    rows = _option_rows(command, ctx)
    out += ["| option | value | default | description |", "| --- | --- | --- | --- |"]
    out += [f"| {r.names} | {r.value} | {r.default} | {_cell(r.help)} |" for r in rows]
    out += ["", "| exit | meaning |", "| ---: | --- |"]
    out += [f"| {code} | {_cell(text)} |" for code, text in exit_codes(name)]
    see = SEE_ALSO.get(name)
    if see:
        out += ["", "See also: " + ", ".join(f"[{p}]({p})" for p in see) + "."]
    out.append("")
    return out


def render(group: click.Group | None = None) -> str:
    """The whole ``docs/cli.md`` page."""
    if group is None:
        from kvspec.cli import cli as group
    cmds = commands(group)
    summary = "\n".join(f"| [`{n}`](#kvspec-{n}) | {_cell(_first_sentence(c))} |"
                        for n, c in cmds)
    lines = [_PREAMBLE.format(summary=summary)]
    for name, command in cmds:
        lines += _command_section(name, command, group)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m kvspec.cli_docs``: print the page to stdout."""
    if argv if argv is not None else sys.argv[1:]:
        print("usage: python -m kvspec.cli_docs > docs/cli.md", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
