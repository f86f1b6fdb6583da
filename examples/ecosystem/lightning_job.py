"""PyTorch Lightning over delaycomm (docs/ecosystem.md, "Lightning"): choose the backend as Lightning chooses any,
with DDPStrategy(process_group_backend="delaycomm").

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ecosystem/lightning_job.py

--way ddp is strategy="ddp" with no backend named: it runs, on Gloo, and delaycomm is never used.
"""

from __future__ import annotations

import common
import lightning
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = common.model()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    args = common.parse_args(__doc__, ways=("recipe", "ddp"))
    strategy = "ddp" if args.way == "ddp" else DDPStrategy(process_group_backend=args.backend)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Classifier()
    # Lightning puts a DistributedSampler (no shuffling: the loader does not shuffle) in front of the loader.
    trainer.fit(module, DataLoader(common.dataset(args.steps * args.batch * 2), batch_size=args.batch))
    common.finish(args, "Lightning", module.parameters(), {"lightning": lightning.__version__})
    # NOTE: Lightning leaves the process group alive; destroy it, as docs/ecosystem.md advises.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
