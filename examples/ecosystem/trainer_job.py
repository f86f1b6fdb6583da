"""transformers' Trainer over delaycomm (docs/ecosystem.md, "transformers Trainer"): initialise the process group
yourself and leave ddp_backend unset; the Trainer takes the group as it finds it.

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ecosystem/trainer_job.py

--way ddp_backend is the Trainer's own way, TrainingArguments(ddp_backend="delaycomm"), which it refuses.
--find-unused-parameters false passes TrainingArguments(ddp_find_unused_parameters=False): the recipe for
staleness (docs/ecosystem.md, "Staleness under the Trainer"); by default the Trainer passes True for a model that is
not a PreTrainedModel with activation checkpointing on, and delaycomm then keeps DDP's buckets fresh.
--static-graph passes TrainingArguments(ddp_static_graph=True), the other recipe (find_unused_parameters may stay).
"""

from __future__ import annotations

import tempfile

import common
import torch
import torch.distributed as dist
import transformers
from transformers import Trainer, TrainingArguments

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


class Classifier(torch.nn.Module):
    """The Trainer wants a model that returns its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = common.model()

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _add_args(parser) -> None:
    parser.add_argument(
        "--find-unused-parameters",
        choices=("default", "true", "false"),
        default="default",
        help="TrainingArguments(ddp_find_unused_parameters=...) (default: left unset, the Trainer's default)",
    )
    parser.add_argument("--static-graph", action="store_true", help="TrainingArguments(ddp_static_graph=True)")


def main() -> None:
    args = common.parse_args(__doc__, ways=("recipe", "ddp_backend"), add=_add_args)
    extra = {}
    if args.find_unused_parameters != "default":
        extra["ddp_find_unused_parameters"] = args.find_unused_parameters == "true"
    if args.static_graph:
        extra["ddp_static_graph"] = True
    if args.way == "ddp_backend":
        extra["ddp_backend"] = args.backend
    else:
        # The recipe: the group first, ddp_backend unset.
        dist.init_process_group(backend=args.backend)
    data = common.dataset(args.steps * args.batch * 2)
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp,
            use_cpu=True,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=0.01,
            seed=0,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            **extra,
        )
        model = Classifier()
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=data,
            data_collator=lambda rows: {
                "x": torch.stack([r[0] for r in rows]),
                "labels": torch.stack([r[1] for r in rows]),
            },
        )
        trainer.train()
    common.finish(args, "transformers Trainer", model.parameters(), {"transformers": transformers.__version__})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
