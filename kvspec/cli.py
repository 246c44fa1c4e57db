"""The ``kvspec`` command line: thin commands over the library.

Exit codes (documented in docs/cli.md): 0 ok, 1 invalid input (a
:class:`~kvspec.errors.KvspecError`), 2 usage error. ``main`` is the one place
that turns exceptions into exits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kvspec import __version__
from kvspec.errors import EXIT_INVALID, EXIT_USAGE, KvspecError, UsageError

def parse_bytes(text: str, *, option: str = "--memory") -> int:
    """``40GiB``, ``40 GB``, ``42949672960`` -> bytes (a usage error otherwise)."""
    from kvspec.files import parse_size
    return parse_size(text, what=option, error=UsageError)


def parse_memory_range(text: str) -> list[int]:
    """``20GiB..80GiB`` (7 points) or ``20GiB..80GiB:10GiB`` -> budgets."""
    span, _, step = text.partition(":")
    lo_s, _, hi_s = span.partition("..")
    lo, hi = parse_bytes(lo_s), parse_bytes(hi_s)
    if hi < lo:
        raise UsageError("--memory range must go from small to large", found=text)
    if step:
        inc = parse_bytes(step)
        if inc <= 0:
            raise UsageError("--memory range step must be positive", found=text)
        out, v = [], lo
        while v <= hi and len(out) < 1000:
            out.append(v)
            v += inc
        return out
    n = 7
    return sorted({lo + (hi - lo) * i // (n - 1) for i in range(n)})


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvspec")
def cli() -> None:
    """Declare, review and load KV-cache memory layouts."""


@cli.command()
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Artifact path (default: SOURCE with .kvlayout.json).")
@click.option("--memory", help="Plan the artifact's budget section for this memory per rank.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
def compile(source: Path, output: Path | None, memory: str | None, quiet: bool) -> None:  # noqa: A001
    """Compile SOURCE into a frozen layout artifact and print its summary."""
    from kvspec.compiler import compile_unit
    from kvspec.report import summary

    unit = compile_unit(source, memory=parse_bytes(memory) if memory else None)
    assert unit.artifact is not None
    out = output or default_artifact_path(source)
    unit.artifact.write(out)
    if not quiet:
        click.echo(summary(unit.artifact))
        click.echo(f"wrote {out}")


def default_artifact_path(source: Path) -> Path:
    name = source.name
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return source.with_name(name + ".kvlayout.json")


@cli.command()
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
def validate(sources: tuple[Path, ...]) -> None:
    """Check SOURCES without writing anything."""
    from kvspec.compiler import compile_unit

    for source in sources:
        compile_unit(source)
        click.echo(f"{source}: ok")


@cli.command()
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--memory", help="Memory per rank (40GiB, 42949672960), or a sweep "
              "20GiB..80GiB[:10GiB]. Default: the source's engine.memory.")
@click.option("--num-blocks", type=int, help="Plan for this many blocks instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the reference view as JSON.")
@click.option("--views", is_flag=True, help="With --json: include every layer's view.")
def plan(source: Path, memory: str | None, num_blocks: int | None, as_json: bool,
         views: bool) -> None:
    """Print the plan of SOURCE for a memory budget."""
    from kvspec.compiler import compile_unit, expand_pass, load, locate, parse, plan_pass
    from kvspec.planner.plan import resolve
    from kvspec.refview import error_view, reference_view
    from kvspec.report import plan_table, sweep_table

    unit = compile_unit(source, passes=(load, parse, expand_pass, plan_pass))
    assert unit.plan is not None and unit.source is not None
    if memory and ".." in memory:
        budgets = parse_memory_range(memory)
        rows = []
        for budget in budgets:
            try:
                rows.append((budget, resolve(unit.plan, memory=budget), None))
            except KvspecError as err:
                rows.append((budget, None, err))
        if as_json:
            _echo_json([reference_view(unit.plan, r) if r else
                        {"memory": b, **error_view(e)} for b, r, e in rows])
        else:
            click.echo(sweep_table(unit.plan, rows))
        return
    budget = parse_bytes(memory) if memory else (
        int(unit.source.engine.memory) if unit.source.engine.memory is not None else None)
    try:
        resolved = resolve(unit.plan, memory=budget, num_blocks=num_blocks)
    except KvspecError as err:
        if as_json:
            _echo_json(error_view(err))
            raise SystemExit(EXIT_INVALID) from None
        raise locate(err, unit) from None
    if as_json:
        _echo_json(reference_view(unit.plan, resolved, with_views=views))
    else:
        click.echo(plan_table(unit.plan, resolved))


@cli.command("import")
@click.argument("dump", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the source (default: stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def import_(dump: Path, output: Path | None, force: bool) -> None:
    """Turn a per-layer spec dump (JSON) into a kvspec source."""
    from kvspec.files import emit, refuse_overwrite
    from kvspec.compiler import compile_source
    from kvspec.importer import dump_to_yaml
    from kvspec.specdump import load_dump

    data = load_dump(dump)
    try:
        text = dump_to_yaml(data)
    except KvspecError as err:
        raise err.at(_file_location(dump)) from None
    except (KeyError, TypeError) as exc:
        raise KvspecError(f"not a per-layer spec dump: missing or bad field {exc}",
                          file=str(dump), hint="see docs/format.md, 'Importing a deployment'"
                          ) from None
    compile_source(text, str(output or "<imported>"))  # what we write must compile
    refuse_overwrite(output, force)
    emit(text, output)


def _file_location(path: Path):
    from kvspec.errors import Location
    return Location(str(path))


def _register_commands() -> None:
    """Add the commands that live in ``kvspec.commands.*`` (one module each,
    exporting ``command``), so tools can grow without touching this file."""
    import importlib
    import pkgutil

    import kvspec.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"kvspec.commands.{info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            cli.add_command(command)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turn errors into messages and exit codes."""
    try:
        code = cli.main(args=argv, prog_name="kvspec", standalone_mode=False)
    except KvspecError as err:
        click.echo(err.render(), err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INVALID)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except SystemExit:
        raise
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
