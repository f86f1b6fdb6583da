"""What delaycomm's build needs to know about the installed torch: one script, run by the build backend
(build_backend/delaycomm_build.py) and by CMakeLists.txt, so that both see the same torch.

    python build_backend/torch_info.py            JSON: the torch found, and from which environment
    python build_backend/torch_info.py --cmake    the same as CMake `set()` lines

NOTE: pip's default build isolation runs the build in an environment of its own, where the user's torch is not
importable (pip hides the environment's site-packages through PYTHONPATH). delaycomm must compile against the torch
the user has installed, never against one installed for the build (an unpinned torch there is a multi-GB CUDA
download). So where `import torch` fails, this script asks the same interpreter again in isolated mode (`-I`: no
PYTHONPATH, so the environment's own site-packages), which is the environment that pip is installing into.

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

# torch's names for CUDA architectures (torch.utils.cpp_extension, TORCH_CUDA_ARCH_LIST); combined names first.
NAMED_ARCHES = {
    "Kepler+Tesla": "3.7",
    "Kepler": "3.5+PTX",
    "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX",
    "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX",
    "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX",
    "Ada": "8.9+PTX",
    "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}
# Without TORCH_CUDA_ARCH_LIST and without a visible GPU: the data-center GPUs users run (A100, H100/H200,
# B200), and PTX of the newest for what comes after (docs/install.md). sm_100 needs CUDA >= 12.8.
DEFAULT_ARCHES = ("8.0", "9.0", "10.0+PTX")
DEFAULT_ARCHES_BEFORE_CUDA_12_8 = ("8.0", "9.0+PTX")
_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def parse_arch_list(text: str, source: str = "TORCH_CUDA_ARCH_LIST") -> list[str]:
    """TORCH_CUDA_ARCH_LIST (``"8.0;9.0+PTX"``, ``"Ampere Hopper"``, ``"9.0a"``) as CMake's CUDA_ARCHITECTURES
    (``["80-real", "90-real", "90-virtual"]``), as torch reads it: separated by ';', ' ' or ',', names expanded."""
    for name, arches in NAMED_ARCHES.items():
        text = text.replace(name, arches)
    items = [item for item in re.split(r"[;, ]+", text.strip()) if item]
    if not items:
        raise ValueError(f"{source} is empty; expected e.g. '8.0;9.0+PTX' or 'Ampere;Hopper'")
    out: list[str] = []
    for item in items:
        m = _ARCH.match(item)
        if m is None:
            raise ValueError(
                f"{source}: {item!r} is not a CUDA architecture; expected MAJOR.MINOR with an optional 'a' or "
                f"'f' and '+PTX' (e.g. 8.0, 9.0a, 10.0+PTX) or one of {', '.join(NAMED_ARCHES)}"
            )
        num = f"{m[1]}{m[2]}{m[3]}"
        for arch in [f"{num}-real"] + ([f"{num}-virtual"] if m[4] else []):
            if arch not in out:
                out.append(arch)
    return out


def default_arch_list(cuda_version: str) -> list[str]:
    major, minor = (int(x) for x in cuda_version.split(".")[:2])
    before_12_8 = (major, minor) < (12, 8)
    return parse_arch_list(";".join(DEFAULT_ARCHES_BEFORE_CUDA_12_8 if before_12_8 else DEFAULT_ARCHES), "default")


def visible_gpu_arches(torch) -> list[str]:
    """The capabilities of the visible GPUs, as torch.utils.cpp_extension picks them (PTX of the newest)."""
    try:
        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001  (no driver, whatever torch raises for it: no GPU to build for)
        return []
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(count)})
    if not caps:
        return []
    return parse_arch_list(";".join(f"{a}.{b}" for a, b in caps) + "+PTX", "the visible GPUs")


def cuda_architectures(torch) -> tuple[list[str], str]:
    """The CUDA architectures to compile for and why: TORCH_CUDA_ARCH_LIST, else the visible GPUs, else the
    default list."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    if env and env != "native":
        return parse_arch_list(env), f"TORCH_CUDA_ARCH_LIST={env}"
    gpus = visible_gpu_arches(torch)
    if gpus:
        return gpus, "the visible GPUs"
    return default_arch_list(torch.version.cuda), "the default list (no TORCH_CUDA_ARCH_LIST, no visible GPU)"


def nvidia_include_dirs(torch_dir: str) -> list[str]:
    """The headers that CUDA builds of torch ship beside it (site-packages/nvidia/*/include: the CUDA runtime's,
    cuSPARSE's, NCCL's...), which torch's own headers include."""
    nvidia = os.path.join(os.path.dirname(torch_dir), "nvidia")
    if not os.path.isdir(nvidia):
        return []
    return sorted(
        os.path.join(nvidia, d, "include")
        for d in os.listdir(nvidia)
        if os.path.isdir(os.path.join(nvidia, d, "include"))
    )


def release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13'."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return f"{m[1]}.{m[2]}"


def torch_requirement(version: str) -> str:
    """The requirement a wheel built against torch ``version`` puts in its metadata."""
    return f"torch=={release(version)}.*"


def _query() -> dict:
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the entry points (delaycomm's own, if installed) stay out
    import torch

    info = {
        "dir": os.path.dirname(torch.__file__),
        "version": torch.__version__,
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cuda": torch.version.cuda or "",
        "python": sys.executable,
        "isolated": bool(sys.flags.isolated),
    }
    info["nvidia_include_dirs"] = nvidia_include_dirs(info["dir"])
    if info["cuda"]:
        try:
            info["cuda_architectures"], info["cuda_architectures_from"] = cuda_architectures(torch)
        except ValueError as e:  # a bad TORCH_CUDA_ARCH_LIST: reported by main()
            info["error"] = str(e)
    return info


def find_torch() -> dict | None:
    """The installed torch, or None. In a build-isolated environment, the environment pip installs into."""
    try:
        return _query()
    except ModuleNotFoundError as e:
        if e.name != "torch" or sys.flags.isolated:
            raise
    # The caller's bytecode settings, which -I would drop with the environment (a torch import compiles thousands
    # of sources where no cache is kept).
    flags = ["-B"] if sys.dont_write_bytecode else []
    if sys.pycache_prefix:
        flags += ["-X", f"pycache_prefix={sys.pycache_prefix}"]
    out = subprocess.run(
        [sys.executable, "-I", *flags, os.path.abspath(__file__), "--json-or-none"],
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    )
    return json.loads(out.stdout)


def _cmake(info: dict) -> str:
    def q(value) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        f"set(TORCH_DIR {q(info['dir'])})",
        f"set(TORCH_VERSION {q(info['version'])})",
        f"set(TORCH_CXX11_ABI {info['cxx11_abi']})",
        f"set(TORCH_CUDA_VERSION {q(info['cuda'])})",
        f"set(TORCH_NVIDIA_INCLUDE_DIRS {q(';'.join(info['nvidia_include_dirs']))})",
        f"set(TORCH_FOUND_ISOLATED {'ON' if info['isolated'] else 'OFF'})",
    ]
    if info["cuda"]:
        lines.append(f"set(TORCH_CUDA_ARCHITECTURES {q(';'.join(info['cuda_architectures']))})")
        lines.append(f"set(TORCH_CUDA_ARCHITECTURES_FROM {q(info['cuda_architectures_from'])})")
    return "\n".join(lines) + "\n"


# What a build without pip's build isolation needs installed first (pyproject.toml's [tool.delaycomm] build-tools,
# which scripts/setup.sh installs; a test holds the two together).
# The oldest torch release the sources build and pass the tests against (pyproject.toml's dependency says the same;
# docs/install.md, "Supported torch releases").
MIN_TORCH = "2.12"
BUILD_TOOLS = "'scikit-build-core>=0.10' 'cmake>=3.26' ninja"
NOT_FOUND = """\
delaycomm compiles against the torch installed in the environment it is installed into, and {python} has none.
Install torch first, then build delaycomm from source (docs/install.md):
    pip install 'torch>={min_torch}'
    pip install {source}
or, without pip's build isolation (which also works where the build environment cannot see torch):
    pip install {tools}
    pip install --no-build-isolation {source}"""


def main(argv: list[str]) -> int:
    if argv == ["--json-or-none"]:
        try:
            info = _query()
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            info = None
        print(json.dumps(info))
        return 0
    info = find_torch()
    if info is None:
        message = NOT_FOUND.format(python=sys.executable, source=".", tools=BUILD_TOOLS, min_torch=MIN_TORCH)
        print(message, file=sys.stderr)
        return 3
    if "error" in info:
        print(f"delaycomm: {info['error']}", file=sys.stderr)
        return 2
    sys.stdout.write(_cmake(info) if argv == ["--cmake"] else json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
