"""delaycomm's PEP 517 build backend: scikit-build-core, bound to the torch installed where delaycomm goes.

pyproject.toml names it (``backend-path = ["build_backend"]``). Around scikit_build_core.build it:

- finds the installed torch before anything is built (build_backend/torch_info.py; under pip's default build
  isolation, in the environment pip installs into), and stops at once, saying what to install and how, where there
  is none;
- keys the build directory by that torch's version (``build/torch-2.13.0+cpu/<wheel tag>``) unless ``-Cbuild-dir``
  names one, so that a build for another torch never reuses its objects;
- writes the torch release it was built against into the wheel's metadata (``Requires-Dist: torch==2.13.*``), as
  C++ extensions of torch do: the compiled module links against that release's C++ symbols;
- removes the build directory again when a build that created it fails.

docs/install.md says how users install; tests/install/ tests each of these.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import torch_info

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

NO_SCIKIT_BUILD = """\
delaycomm's build backend needs scikit-build-core, which is not installed in {python}.
pip installs it by itself with its default build isolation (`pip install .`); without build isolation, install the
build tools first:
    pip install {tools}
    pip install --no-build-isolation ."""


def _fail(message: str):
    # SystemExit, not an exception: pip shows the backend's output, and a traceback would bury the message.
    print(f"\n{message}\n", file=sys.stderr)
    raise SystemExit(1)


def _skbuild():
    try:
        from scikit_build_core import build
    except ImportError:
        _fail(NO_SCIKIT_BUILD.format(python=sys.executable, tools=torch_info.BUILD_TOOLS))
    return build


def _torch() -> dict:
    info = torch_info.find_torch()
    if info is None:
        _fail(
            torch_info.NOT_FOUND.format(
                python=sys.executable, source=".", tools=torch_info.BUILD_TOOLS, min_torch=torch_info.MIN_TORCH
            )
        )
    if "error" in info:
        _fail(f"delaycomm: {info['error']}")
    print(f"delaycomm: building against torch {info['version']} at {info['dir']}", file=sys.stderr)
    return info


def _settings(config_settings: dict | None, info: dict) -> dict:
    settings = dict(config_settings or {})
    if "build-dir" not in settings and "build_dir" not in settings:
        settings["build-dir"] = f"build/torch-{info['version']}/{{wheel_tag}}"
    return settings


def pin_metadata(text: str, requirement: str) -> str:
    """METADATA with its ``Requires-Dist: torch...`` line replaced by ``Requires-Dist: <requirement>``."""
    pattern = re.compile(r"^Requires-Dist: torch(?![\w.-])[^;\n]*$", re.MULTILINE)
    new, n = pattern.subn(f"Requires-Dist: {requirement}", text)
    if n != 1:
        raise RuntimeError(f"delaycomm's build: expected one 'Requires-Dist: torch' line in METADATA, found {n}")
    return new


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pin_wheel(path: Path, requirement: str) -> None:
    """Rewrite the wheel at ``path`` with its torch requirement pinned (METADATA and its RECORD line)."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as zin:
        infos = zin.infolist()
        metadata = next(i.filename for i in infos if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename))
        record = metadata.rsplit("/", 1)[0] + "/RECORD"
        pinned = pin_metadata(zin.read(metadata).decode(), requirement).encode()
        with zipfile.ZipFile(tmp, "w") as zout:
            for info in infos:
                data = zin.read(info)
                if info.filename == metadata:
                    data = pinned
                elif info.filename == record:
                    lines = [
                        f"{metadata},{_record_hash(pinned)},{len(pinned)}" if line.startswith(metadata + ",") else line
                        for line in data.decode().splitlines()
                    ]
                    data = ("\n".join(lines) + "\n").encode()
                zout.writestr(info, data)
    os.replace(tmp, path)


def _build_root(settings: dict) -> Path:
    """The part of the build directory before its first placeholder (what a failed build may remove)."""
    build_dir = settings.get("build-dir", settings.get("build_dir"))
    return Path(str(build_dir).split("{", 1)[0].rstrip("/") or ".")


def _cleaning_on_failure(settings: dict, build):
    """Run ``build()``; where it fails, remove the build directories it created (never one that was there)."""
    root = _build_root(settings).resolve()
    created = [d for d in [root, *root.parents] if not d.exists() and Path.cwd() in d.parents]
    try:
        return build()
    except BaseException:
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost one it created; the rest are inside
        raise


def _wheel(hook: str, wheel_directory, config_settings, metadata_directory):
    info = _torch()
    settings = _settings(config_settings, info)
    skbuild = _skbuild()
    # NOTE: the prepared metadata is pinned after scikit-build-core wrote it, so it is not handed back to
    # scikit-build-core (which compares it with its own); the wheel is pinned the same way below.
    name = _cleaning_on_failure(settings, lambda: getattr(skbuild, hook)(wheel_directory, settings, None))
    pin_wheel(Path(wheel_directory) / name, torch_info.torch_requirement(info["version"]))
    return name


def _metadata(hook: str, metadata_directory, config_settings):
    info = _torch()
    name = getattr(_skbuild(), hook)(metadata_directory, _settings(config_settings, info))
    path = Path(metadata_directory) / name / "METADATA"
    path.write_text(pin_metadata(path.read_text(), torch_info.torch_requirement(info["version"])))
    return name


def get_requires_for_build_wheel(config_settings=None):
    _torch()  # stop at once where there is no torch, before pip installs CMake and ninja for the build
    return _skbuild().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _torch()
    return _skbuild().get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _skbuild().get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _metadata("prepare_metadata_for_build_wheel", metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _metadata("prepare_metadata_for_build_editable", metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel("build_wheel", wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel("build_editable", wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _skbuild().build_sdist(sdist_directory, config_settings)
