"""The torch that delaycomm's native module was built against, checked against the torch it runs with.

delaycomm._C links against the C++ symbols of one torch release. Loaded under another, it fails in the dynamic
loader with a message that names a symbol (``undefined symbol: ...``, ``referenced unknown base type``) and no
release. ``import delaycomm`` (and the first delaycomm group, which imports it) checks first and raises an
ImportError naming both releases and the rebuild command. CMakeLists.txt writes ``_built_for.py`` beside ``_C``.
"""

from __future__ import annotations

import os
import re

import torch

DOCS = "docs/install.md"


def _release(version: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m[1]}.{m[2]}" if m else version


def _rebuild(source_dir: str | None) -> str:
    source = source_dir if source_dir and os.path.isfile(os.path.join(source_dir, "pyproject.toml")) else "<source>"
    return f"pip install --no-build-isolation --no-deps --force-reinstall {source}"


def mismatch(running: str, running_cuda: str | None, built: str, built_cuda: bool, source_dir: str | None):
    """The error message where the build does not fit the running torch, else None."""
    if _release(running) != _release(built):
        why = f"delaycomm was built against torch {built} and this is torch {running}"
    elif built_cuda and not running_cuda:
        why = f"delaycomm was built with its CUDA sources against torch {built}, and this torch ({running}) has no CUDA"
    else:
        return None
    return (
        f"{why}: its native module links against one torch release's C++ symbols. Rebuild it against the installed "
        f"torch ({_rebuild(source_dir)}), or install torch {_release(built)}.* ({DOCS})"
    )


def check_torch() -> None:
    try:
        from delaycomm import _built_for
    except ImportError:  # a source tree without a build: importing _C fails next, with its own message
        return
    message = mismatch(
        torch.__version__, torch.version.cuda, _built_for.TORCH_VERSION, _built_for.CUDA, _built_for.SOURCE_DIR
    )
    if message is not None:
        raise ImportError(message)


def load_error(error: ImportError) -> ImportError:
    """An ImportError of ``_C`` with the torch releases added (the loader's message names a symbol only)."""
    try:
        from delaycomm import _built_for

        built = f"torch {_built_for.TORCH_VERSION}"
        source_dir = _built_for.SOURCE_DIR
    except ImportError:
        built, source_dir = "an unknown torch (no delaycomm/_built_for.py: not built with its CMakeLists.txt?)", None
    return ImportError(
        f"delaycomm's native module failed to load under torch {torch.__version__} (built against {built}): "
        f"{error}. Rebuild it against the installed torch: {_rebuild(source_dir)} ({DOCS})"
    )
