"""`backend="delaycomm"` is available after `import torch` alone (entry point), cheaply, and can be disabled."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = (
    "import sys, torch, torch.distributed as dist; "
    "print('registered' if 'delaycomm' in dist.Backend.backend_list else 'absent'); "
    "print('native' if 'delaycomm._C' in sys.modules else 'lazy')"
)


def _run(env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout.split()


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
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "delaycomm [1.0, 1.0, 1.0]"
