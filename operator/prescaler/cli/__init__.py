"""The ``prescaler`` command line: ``plan``, ``forecast``, ``backtest``, ``run`` and ``admit``.

Each subcommand lives in its own module that exposes ``register(subparsers)``; the module
sets ``func`` on its parser. Subcommand modules import heavy dependencies (Prophet, kopf,
matplotlib) inside their handlers so that ``prescaler --help`` stays instant.

Bad input never produces a traceback: handlers raise :class:`CliError` (or ``ValueError``
from the domain), which is printed as one line naming the offending flag, with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from prescaler.cli._common import ArgumentParser, CliError

__all__ = ["CliError", "build_parser", "main"]

# Subcommand modules, in help order. A module that is not there yet is skipped.
_SUBCOMMANDS = ("plan", "forecast", "backtest", "run", "admit")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="prescaler",
        description="Predictive pre-scaling of LLM inference on Kubernetes.",
    )
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser
    )
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"prescaler.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"prescaler.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (CliError, ValueError) as exc:
        print(f"prescaler {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`prescaler ... | head`): stop quietly, as other CLIs do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return code
