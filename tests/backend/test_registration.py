"""`backend="delaycomm"` is available after `import torch` alone (entry point), cheaply, and can be disabled.

Each test needs a fresh interpreter: what is checked happens during `import torch`.
"""

from __future__ import annotations

import os

from tests.harness import run_cli

CHECK = (
    "import sys, torch, torch.distributed as dist; "
    "print('registered' if 'delaycomm' in dist.Backend.backend_list else 'absent'); "
    "print('native' if 'delaycomm._C' in sys.modules else 'lazy')"
)


def _run(env_extra):
    proc = run_cli(["-c", CHECK], env={**os.environ, **env_extra})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_import_torch_registers_without_loading_native_module():
    assert _run({"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}) == ["registered", "lazy"]


def test_autoload_can_be_disabled():
    assert _run({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}) == ["absent", "lazy"]


def test_init_process_group_without_importing_delaycomm(tmp_path):
    script = (
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('delaycomm', init_method='file://" + str(tmp_path / "rdzv") + "', rank=0, "
        "world_size=1)\n"
        "t = torch.ones(3); dist.all_reduce(t); print(dist.get_backend(), t.tolist())\n"
        "dist.destroy_process_group()\n"
    )
    proc = run_cli(["-c", script], env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "delaycomm [1.0, 1.0, 1.0]"
