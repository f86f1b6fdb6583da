"""The build as users install it (docs/install.md): the in-tree backend, the torch it finds, the wheel's torch
requirement, the CUDA architectures, and the check of the torch delaycomm was built against.

Cheap pieces, default run; tests/install/test_pip_from_source.py (slow) runs the README's recipe in a fresh venv.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import zipfile

import pytest
import tomllib
import torch

from tests.harness.procs import run_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND = os.path.join(REPO, "build_backend")
sys.path.insert(0, BACKEND)
import delaycomm_build  # noqa: E402
import torch_info  # noqa: E402

sys.path.remove(BACKEND)

with open(os.path.join(REPO, "pyproject.toml"), "rb") as _f:
    PYPROJECT = tomllib.load(_f)


# ---- CUDA architectures, as torch.utils.cpp_extension reads TORCH_CUDA_ARCH_LIST


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9.0", ["90-real"]),
        ("8.0;9.0+PTX", ["80-real", "90-real", "90-virtual"]),
        ("8.0 8.6", ["80-real", "86-real"]),
        ("8.0,9.0a", ["80-real", "90a-real"]),
        ("Ampere;Hopper", ["80-real", "86-real", "86-virtual", "90-real", "90-virtual"]),
        ("Ampere+Tegra", ["87-real"]),
        ("10.0+PTX 10.0", ["100-real", "100-virtual"]),
    ],
)
def test_arch_list_reads_as_torch_reads_it(text, expected):
    assert torch_info.parse_arch_list(text) == expected


@pytest.mark.parametrize("text", ["sm_90", "9", "9.0+ptx", "Hoper", ";"])
def test_a_bad_arch_list_names_the_variable_and_the_value(text):
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST") as e:
        torch_info.parse_arch_list(text)
    assert "is empty" in str(e.value) or repr(text.strip(";").split(";")[0]) in str(e.value)


def test_the_default_covers_the_data_center_gpus_with_ptx_of_the_newest():
    assert torch_info.default_arch_list("13.0") == ["80-real", "90-real", "100-real", "100-virtual"]
    assert torch_info.default_arch_list("12.8") == ["80-real", "90-real", "100-real", "100-virtual"]
    # sm_100 needs CUDA 12.8: before it, PTX of sm_90 covers the newer GPUs
    assert torch_info.default_arch_list("12.6") == ["80-real", "90-real", "90-virtual"]


class _FakeCuda:
    def __init__(self, caps):
        self.caps = caps

    def device_count(self):
        return len(self.caps)

    def get_device_capability(self, i):
        return self.caps[i]


class _FakeTorch:
    def __init__(self, caps, cuda="13.0"):
        self.cuda = _FakeCuda(caps)
        self.version = type("v", (), {"cuda": cuda})


def test_arches_come_from_the_variable_then_the_visible_gpus_then_the_default(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.9")
    assert torch_info.cuda_architectures(_FakeTorch([(9, 0)]))[0] == ["89-real"]
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    arches, why = torch_info.cuda_architectures(_FakeTorch([(9, 0), (8, 0), (9, 0)]))
    assert (arches, why) == (["80-real", "90-real", "90-virtual"], "the visible GPUs")
    arches, why = torch_info.cuda_architectures(_FakeTorch([]))
    assert arches == torch_info.default_arch_list("13.0") and "default" in why
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "native")  # torch's word for "the visible GPUs"
    assert torch_info.cuda_architectures(_FakeTorch([(8, 6)]))[0] == ["86-real", "86-virtual"]


def test_the_cmake_file_sets_the_arches_before_enabling_cuda():
    """(enable_language sets nvcc's own default where the variable is unset; scripts/cuda-check.sh checks the
    architectures in the built module.)"""
    code = [line.split("#")[0].strip() for line in open(os.path.join(REPO, "CMakeLists.txt"))]
    assert code.index('set(CMAKE_CUDA_ARCHITECTURES "${TORCH_CUDA_ARCHITECTURES}")') < code.index(
        "enable_language(CUDA)"
    )


def test_nvidia_headers_beside_torch_are_found(tmp_path):
    torch_dir = tmp_path / "site-packages" / "torch"
    torch_dir.mkdir(parents=True)
    for d in ("cu13", "nccl", "cudnn"):
        (tmp_path / "site-packages" / "nvidia" / d / "include").mkdir(parents=True)
    (tmp_path / "site-packages" / "nvidia" / "lib-only").mkdir()
    found = torch_info.nvidia_include_dirs(str(torch_dir))
    assert [os.path.basename(os.path.dirname(d)) for d in found] == ["cu13", "cudnn", "nccl"]
    assert torch_info.nvidia_include_dirs(str(tmp_path / "nowhere" / "torch")) == []


# ---- which torch the build finds


def test_the_installed_torch_is_found_from_a_build_isolated_environment(tmp_path):
    """pip's build isolation hides the environment's site-packages with a sitecustomize on PYTHONPATH; the build
    then finds the torch of the environment pip installs into, never one of its own."""
    hide = tmp_path / "isolation"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\nsys.path[:] = [p for p in sys.path if 'site-packages' not in p]\n"
    )
    env = dict(os.environ, PYTHONPATH=str(hide), PYTHONNOUSERSITE="1")
    probe = run_command([sys.executable, "-c", "import torch"], timeout=120, env=env)
    assert "No module named 'torch'" in probe.stderr  # the isolation hides it
    out = run_command([sys.executable, os.path.join(BACKEND, "torch_info.py")], timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["isolated"] is True
    assert info["dir"] == os.path.dirname(torch.__file__) and info["version"] == torch.__version__


def test_without_torch_the_build_stops_at_once_saying_how(tmp_path):
    """In an environment without torch, the backend's first hook fails, naming torch, --no-build-isolation and
    the build tools, before anything is built or a build directory made."""
    venv = tmp_path / "venv"
    assert run_command([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120).returncode == 0
    src = tmp_path / "src"
    src.mkdir()
    out = run_command(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import sys; sys.path.insert(0, {BACKEND!r}); import delaycomm_build; "
            "delaycomm_build.get_requires_for_build_wheel()",
        ],
        timeout=120,
        cwd=str(src),
    )
    assert out.returncode == 1, out.stderr
    assert "has none" in out.stderr and "pip install 'torch>=" in out.stderr
    assert "pip install --no-build-isolation ." in out.stderr
    assert torch_info.BUILD_TOOLS in out.stderr
    assert "Traceback" not in out.stderr
    assert list(src.iterdir()) == []


def test_the_lists_of_build_tools_and_the_torch_range_agree():
    assert torch_info.BUILD_TOOLS == " ".join(
        f"'{t}'" if re.search(r"[<>=]", t) else t for t in PYPROJECT["tool"]["delaycomm"]["build-tools"]
    )
    assert f"torch>={torch_info.MIN_TORCH}" in PYPROJECT["project"]["dependencies"]
    # torch is never a build requirement: an isolated build would download (a CUDA) one and link against it
    assert not any(re.match(r"torch\b", r) for r in PYPROJECT["build-system"]["requires"])
    assert PYPROJECT["build-system"]["build-backend"] == "delaycomm_build"


# ---- the wheel names its torch


def test_the_requirement_is_the_release_built_against():
    assert torch_info.torch_requirement("2.13.0+cpu") == "torch==2.13.*"
    assert torch_info.torch_requirement("2.15.1") == "torch==2.15.*"


def test_pin_metadata_replaces_the_range():
    text = "Metadata-Version: 2.4\nName: delaycomm\nRequires-Dist: torch>=2.13\nRequires-Dist: torchvision\n"
    pinned = delaycomm_build.pin_metadata(text, "torch==2.13.*")
    assert "Requires-Dist: torch==2.13.*\n" in pinned and "Requires-Dist: torchvision\n" in pinned
    assert "torch>=" not in pinned
    with pytest.raises(RuntimeError, match="one 'Requires-Dist: torch' line"):
        delaycomm_build.pin_metadata("Name: x\n", "torch==2.13.*")


def test_pin_wheel_keeps_the_record_true(tmp_path):
    path = tmp_path / "x-1.0-py3-none-any.whl"
    meta = b"Name: x\nRequires-Dist: torch>=2.13\nRequires-Dist: numpy>=1.24\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x/__init__.py", b"")
        z.writestr("x-1.0.dist-info/METADATA", meta)
        z.writestr("x-1.0.dist-info/RECORD", f"x/__init__.py,,0\nx-1.0.dist-info/METADATA,sha256=old,{len(meta)}\n")
    delaycomm_build.pin_wheel(path, "torch==2.13.*")
    with zipfile.ZipFile(path) as z:
        new = z.read("x-1.0.dist-info/METADATA")
        record = z.read("x-1.0.dist-info/RECORD").decode().splitlines()
        assert z.namelist() == ["x/__init__.py", "x-1.0.dist-info/METADATA", "x-1.0.dist-info/RECORD"]
    assert new == b"Name: x\nRequires-Dist: torch==2.13.*\nRequires-Dist: numpy>=1.24\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(new).digest()).rstrip(b"=").decode()
    assert record == ["x/__init__.py,,0", f"x-1.0.dist-info/METADATA,sha256={digest},{len(new)}"]


def test_the_installed_delaycomm_requires_the_torch_it_was_built_against():
    """The wheel in this venv (scripts/setup.sh built it through the backend)."""
    from delaycomm import _built_for

    requires = importlib.metadata.requires("delaycomm")
    assert f"torch=={torch_info.release(torch.__version__)}.*" in requires
    assert _built_for.TORCH_VERSION == torch.__version__
    assert _built_for.CUDA is bool(torch.version.cuda and _built_for.CUDA)


# ---- import under another torch


def test_a_build_for_another_release_is_named_with_the_rebuild_command(tmp_path):
    from delaycomm import _build

    (tmp_path / "pyproject.toml").write_text("")
    message = _build.mismatch("2.15.0", None, "2.13.0+cpu", False, str(tmp_path))
    assert "built against torch 2.13.0+cpu and this is torch 2.15.0" in message
    assert f"pip install --no-build-isolation --no-deps --force-reinstall {tmp_path}" in message
    assert "torch 2.13.*" in message
    gone = _build.mismatch("2.15.0", None, "2.13.0+cpu", False, str(tmp_path / "gone"))
    assert "--force-reinstall <source>" in gone
    # the same release (another patch, another local label) is the same C++ symbols
    assert _build.mismatch("2.13.1", "13.0", "2.13.0+cpu", False, None) is None
    # CUDA sources need a CUDA torch (its libtorch_cuda)
    assert "no CUDA" in _build.mismatch("2.14.1+cpu", None, "2.14.1", True, None)


def test_import_under_another_torch_raises_naming_both_releases():
    code = "import torch; torch.__version__ = '2.99.0'; import delaycomm"
    out = run_command(
        [sys.executable, "-c", code],
        timeout=120,
        env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: delaycomm was built against torch " + torch.__version__)
    assert "this is torch 2.99.0" in last and "pip install --no-build-isolation" in last


def test_the_first_group_under_another_torch_raises_naming_both_releases():
    """Through the entry point (`import torch` alone registered the backend), the native module loads at the first
    group: the same error there."""
    code = (
        "import torch, torch.distributed as dist; torch.__version__ = '2.99.0'\n"
        "dist.init_process_group('delaycomm', store=dist.HashStore(), rank=0, world_size=1)"
    )
    out = run_command(
        [sys.executable, "-c", code],
        timeout=120,
        env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1"),
    )
    assert out.returncode == 1
    assert "ImportError: delaycomm was built against torch " + torch.__version__ in out.stderr
    assert "this is torch 2.99.0" in out.stderr


@pytest.mark.slow
def test_a_build_dir_configured_for_another_torch_stops_the_configure(tmp_path):
    """(The backend keys its default build directory by torch; a directory given with -Cbuild-dir is checked.)"""
    cmake = os.path.join(os.path.dirname(sys.executable), "cmake")
    out = run_command(
        [
            cmake,
            "-S",
            REPO,
            "-B",
            str(tmp_path),
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DDELAYCOMM_BUILT_FOR_TORCH=2.12.0 /elsewhere/torch",
        ],
        timeout=300,
    )
    assert out.returncode != 0
    message = " ".join(out.stderr.split())
    assert (
        "was configured for torch 2.12.0 /elsewhere/torch, and the installed torch is " + torch.__version__ in message
    )


@pytest.mark.parametrize("existed", [False, True])
def test_a_failed_build_removes_the_build_dirs_it_created(tmp_path, monkeypatch, existed):
    monkeypatch.chdir(tmp_path)
    if existed:
        (tmp_path / "build" / "torch-2.12.0").mkdir(parents=True)
    settings = {"build-dir": "build/torch-2.13.0+cpu/{wheel_tag}"}

    def failing_build():
        (tmp_path / "build" / "torch-2.13.0+cpu" / "cp311-cp311-linux_x86_64" / "CMakeFiles").mkdir(parents=True)
        raise SystemExit(1)

    with pytest.raises(SystemExit):
        delaycomm_build._cleaning_on_failure(settings, failing_build)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == (["build", "build/torch-2.12.0"] if existed else [])
    # a build that succeeds keeps its directory (the next build is incremental)
    delaycomm_build._cleaning_on_failure(
        settings, lambda: (tmp_path / "build" / "torch-2.13.0+cpu").mkdir(parents=True)
    )
    assert (tmp_path / "build" / "torch-2.13.0+cpu").is_dir()
