"""The tools' optional imports: each is named once, with the package that provides it and the extra that installs it.

delaycomm needs torch and numpy; plots, progress bars and the experiment's data set need the packages of
``pyproject.toml``'s ``tools`` extra (a test holds it to :data:`OPTIONAL`; a source install takes it with
``pip install '.[tools]'``, docs/install.md). A flag that needs one of them checks it when the
command line is read (:func:`require_for_flag`), before any work: without it the command exits 2 with ``error:
argument --plot: plotting needs matplotlib, which is not installed: pip install matplotlib``, never a traceback
after minutes of measuring. A progress bar asked for by default (``auto``) is left out quietly when tqdm is missing;
asked for explicitly (``on``), it is an error like the others (:func:`progress_enabled`).
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

__all__ = ["OPTIONAL", "EXTRA", "MissingOptional", "missing_message", "require", "require_for_flag", "progress_enabled"]

#: The extra that installs every optional module of the tools.
EXTRA = "tools"
#: Optional module -> (the package that provides it, what ``pip install`` takes; what the tools use it for).
OPTIONAL = {
    "matplotlib": ("matplotlib", "plotting"),
    "tqdm": ("tqdm", "a progress bar"),
    "sklearn": ("scikit-learn", "the experiment's data set"),
}


class MissingOptional(ImportError):
    """An optional module is not installed (the message names the package and the extra)."""


def missing_message(module: str, what: str | None = None) -> str:
    """``<what> needs <package>, which is not installed: pip install <package>``; ``what`` defaults to the
    module's use (``plotting``, ``a progress bar``). NOTE: not ``pip install 'delaycomm[tools]'``: delaycomm is not
    on an index, and the extra of a source install needs its source tree (docs/install.md)."""
    package, use = OPTIONAL[module]
    what = what or use
    return f"{what} needs {package}, which is not installed: pip install {package}"


def require(module: str, what: str | None = None) -> ModuleType:
    """Import the optional ``module`` (a key of :data:`OPTIONAL`) for ``what`` (default: its use in :data:`OPTIONAL`).

    Raises:
        MissingOptional: it cannot be imported; the message is :func:`missing_message`'s.
    """
    if module not in OPTIONAL:
        raise KeyError(f"require: {module!r} is not an optional module of the tools; expected one of {list(OPTIONAL)}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingOptional(missing_message(module, what)) from e


def require_for_flag(parser: argparse.ArgumentParser, flag: str, module: str) -> None:
    """Exit 2 through ``parser`` (``error: argument FLAG: ...``) when ``module``, which ``flag`` needs, is missing."""
    try:
        require(module)
    except MissingOptional as e:
        parser.error(f"argument {flag}: {e}")


def progress_enabled(
    mode: str, is_terminal: bool, parser: argparse.ArgumentParser | None = None, flag: str = "--progress"
) -> bool:
    """Whether to draw a progress bar (tqdm) for ``--progress auto|on|off``.

    ``auto``: when the stream is a terminal and tqdm is installed. ``on``: always; without tqdm, an error through
    ``parser`` (exit 2), or :class:`MissingOptional` when there is no parser. ``off``: never.
    """
    if mode == "off" or (mode == "auto" and not is_terminal):
        return False
    try:
        require("tqdm")
    except MissingOptional as e:
        if mode == "auto":
            return False
        if parser is not None:
            parser.error(f"argument {flag}: {e}")
        raise
    return True
