"""A PyTorch Lightning script with FSDP2 (ModelParallelStrategy, fully_shard in configure_model), run unmodified
under torchrun by tests/stale/test_fsdp.py. delaycomm is chosen as Lightning chooses any backend
(process_group_backend) and configured only through DELAYCOMM_* variables.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/lightning_fsdp2.py
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

import delaycomm


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def on_train_end(self) -> None:
        delaycomm.flush()  # deliver what staleness left in flight


def main() -> None:
    torch.manual_seed(0)
    teacher = torch.randn(32, 4)
    x = torch.randn(64 * 120, 32)
    data = TensorDataset(x, (x @ teacher).argmax(dim=1))
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="delaycomm")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), DataLoader(data, batch_size=64))
    # NOTE: Lightning leaves the process group alive; delaycomm writes its stats at exit then too
    # (tests/stats/test_stats_file.py), but a Gloo group never destroyed aborts now and then at teardown
    # (docs/known-issues.md), which would fail torchrun: destroy it, as that page advises.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
