"""The command line of a benchmark stage, from one definition: the schema of its settings.

A benchmark stage (``benchmark``, ``bench_input``) is a function of its settings, a pydantic model (the
``benchmark`` section of params.yaml, ``config.BenchmarkParams``; ``bench_input``'s own in its stage file).
Every field of that model is an option of the stage's command line (``batch_size`` -> ``--batch-size``),
and the values given go through the same schema as the tracked settings. With any override the results
go to other files than the stage's DVC outputs, which follow the tracked settings alone.
"""

from __future__ import annotations

import argparse
import typing

from pydantic import BaseModel, ValidationError

from dpnrepro.errors import ParamsError

_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "at least"}


def _comma_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_options(ap: argparse.ArgumentParser, schema: type[BaseModel], section: str) -> None:
    """One option per field of ``schema``; an option not given keeps the tracked ``<section>.<field>``."""
    for name, field in schema.model_fields.items():
        kind, kw = field.annotation, {}
        if kind is bool:
            kw = {"action": argparse.BooleanOptionalAction}
        elif typing.get_origin(kind) is list:
            kw = {"type": _comma_list, "metavar": "A,B"}
        elif typing.get_origin(kind) is typing.Literal:
            kw = {"choices": list(typing.get_args(kind))}
        else:
            kw = {"type": kind}
        bounds = [f"{word} {getattr(m, key)}" for m in field.metadata for key, word in _BOUNDS.items()
                  if getattr(m, key, None) is not None]
        notes = [field.description or "", "comma-separated" if "metavar" in kw else "", ", ".join(bounds)]
        help_text = "; ".join(n for n in notes if n) + f" (default: {section}.{name})"
        ap.add_argument(_option(name), default=None, help=help_text.replace("%", "%%"), **kw)


def settings_of(args: argparse.Namespace, tracked: BaseModel, section: str) -> tuple[BaseModel, dict]:
    """``(settings, overrides)``: ``tracked`` with the options given on the command line, validated by its
    schema (an invalid value is a one-line ParamsError naming the option and the field)."""
    overrides = {k: getattr(args, k) for k in type(tracked).model_fields if getattr(args, k) is not None}
    try:
        return type(tracked).model_validate({**tracked.model_dump(), **overrides}), overrides
    except ValidationError as exc:
        raise ParamsError("invalid command-line override: " + "; ".join(
            f"{_option(str(e['loc'][0]))} {overrides.get(e['loc'][0], '')} ({section}.{'.'.join(map(str, e['loc']))}: "
            f"{e['msg']})" for e in exc.errors())) from None


def add_output_options(ap: argparse.ArgumentParser, stage_outs: tuple[str, str], cli_outs: tuple[str, str]) -> None:
    ap.add_argument("--out-json", help=f"default: {stage_outs[0]}, or {cli_outs[0]} with overrides")
    ap.add_argument("--out-md", help=f"default: {stage_outs[1]}, or {cli_outs[1]} with overrides")
    ap.add_argument("--no-progress", action="store_true")


def output_paths(args: argparse.Namespace, custom: bool, stage: str, stage_outs: tuple[str, str],
                 cli_outs: tuple[str, str], tracked_by: str) -> tuple[str, str]:
    """``(json, markdown)`` paths: the stage's outputs, or with ``custom`` settings ``cli_outs``; results
    of custom settings written over the stage's outputs are a one-line error."""
    defaults = cli_outs if custom else stage_outs
    out_json, out_md = args.out_json or defaults[0], args.out_md or defaults[1]
    if custom and {out_json, out_md} & set(stage_outs):
        raise ParamsError(f"{', '.join(stage_outs)} are the `{stage}` stage's outputs and follow {tracked_by} "
                          "alone; write results of command-line overrides elsewhere (--out-json/--out-md)")
    return out_json, out_md
