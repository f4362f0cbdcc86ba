"""Train an LLTM sequence classifier on scikit-learn's 8x8 digits, rows as time steps.

Each image is a sequence of 8 steps of 8 pixels; an ``lltm.LLTMLayer`` reads
it and a linear head classifies its last hidden state. The same script runs

* on the CPU:           ``python examples/train_digits.py --device cpu``
* on one GPU:           ``python examples/train_digits.py --device cuda``
* on two GPUs with DDP: ``torchrun --nproc_per_node=2 examples/train_digits.py --device cuda``
* with FSDP2 instead:   ``torchrun --nproc_per_node=2 examples/train_digits.py --device cuda --fsdp``

Under torchrun each process takes its share of every global batch (NCCL on
CUDA, gloo on the CPU), and DistributedDataParallel averages the gradients
(or, with ``--fsdp``, ``fully_shard`` keeps a shard of each parameter per
process, gathers them for the forward and reduce-scatters the gradients), so
that with the same ``--seed`` and ``--batch-size`` (the global batch) a
run on N processes takes the same steps as a run on one, up to rounding.
``--log-json`` writes the per-step losses to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import lltm


class DigitsClassifier(nn.Module):
    """``LLTMLayer`` over the rows of an image, then a linear head on the last state."""

    def __init__(self, state_size: int, num_layers: int) -> None:
        super().__init__()
        self.rnn = lltm.LLTMLayer(8, state_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(state_size, 10)

    def forward(self, images: Tensor) -> Tensor:
        """Logits ``[batch, 10]`` of images ``[batch, 8, 8]``."""
        _, (h_n, _) = self.rnn(images)
        return self.head(h_n[-1])


def load_data(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The digits as ``[n, 8, 8]``, split 80/20 the same way on every run.

    Each pixel is standardized with the training set's mean and deviation.
    """
    from sklearn.datasets import load_digits  # noqa: PLC0415 - optional dependency
    from sklearn.model_selection import train_test_split  # noqa: PLC0415

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    # (+ 1: the border pixels are almost always 0)
    mean, scale = x_train.mean(0), x_train.std(0) + 1.0
    x_train, x_test = (x_train - mean) / scale, (x_test - mean) / scale

    def put(a: object, dtype: torch.dtype) -> Tensor:
        return torch.as_tensor(a, dtype=dtype, device=device)

    return (
        put(x_train, torch.float32),
        put(y_train, torch.long),
        put(x_test, torch.float32),
        put(y_test, torch.long),
    )


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal (or when forced)."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled

    def update(self, done: int, loss: float) -> None:
        """Redraw with ``done`` of ``total`` steps finished."""
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        print(  # noqa: T201
            f"\r{self.label} [{bar}] {done}/{self.total} loss {loss:.4f}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        """Clear the line for the epoch's summary."""
        if self.enabled:
            print("\r\033[K", end="", file=sys.stderr, flush=True)  # noqa: T201


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch")
    parser.add_argument("--state-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-json", metavar="PATH", help="write the losses as JSON (rank 0)")
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun, shard the model with FSDP2 (fully_shard) instead of DDP",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "on", "off"],
        default="auto",
        help="the progress bar: auto draws it when stderr is a terminal",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, object]:  # noqa: PLR0912, PLR0915
    """Train, print one line per epoch, and return the log."""
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if distributed:
        local_rank = int(os.environ["LOCAL_RANK"])
        if want_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if want_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        local_rank, rank, world = 0, 0, 1
    device = torch.device("cuda", local_rank) if want_cuda else torch.device("cpu")
    if args.batch_size % world != 0:
        msg = f"--batch-size {args.batch_size} must be a multiple of the {world} processes"
        raise SystemExit(msg)
    local_batch = args.batch_size // world
    parallel = ("fsdp" if args.fsdp else "ddp") if distributed else "none"
    main_process = rank == 0

    torch.manual_seed(args.seed)  # the same initial weights in every process
    x_train, y_train, x_test, y_test = load_data(device)
    model: nn.Module = DigitsClassifier(args.state_size, args.num_layers).to(device)
    if parallel == "fsdp":
        # FSDP2: each process keeps and updates a shard of every parameter;
        # the LLTM ops see the whole, gathered ones. One group for the whole
        # model, which is small: a group per layer pays off only when the
        # gathers of later layers can overlap the earlier layers' compute.
        fully_shard(model, mesh=init_device_mesh(device.type, (world,)))
    elif parallel == "ddp":
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if want_cuda else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = len(x_train) // args.batch_size  # full global batches only
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, args.epochs * steps_per_epoch)
    )
    show = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    if main_process:
        how = {"none": "", "ddp": " with DDP", "fsdp": " with FSDP2"}[parallel]
        print(  # noqa: T201
            f"digits: {len(x_train)} train, {len(x_test)} test; LLTMLayer(8, "
            f"{args.state_size}, num_layers={args.num_layers}) + Linear; {world} process(es) on {device.type}{how}, global batch "
            f"{args.batch_size}, {steps_per_epoch} steps per epoch",
            flush=True,
        )
    log: dict[str, object] = {
        "world_size": world,
        "seed": args.seed,
        "global_batch": args.batch_size,
        "parallel": parallel,
        # The parameters' elements in all, and those this process holds: its
        # shards under FSDP2, all of them otherwise.
        "parameters": sum(p.numel() for p in model.parameters()),
        "local_parameters": sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()
        ),
        "step_losses": [],
        "epochs": [],
    }
    step_losses: list[float] = log["step_losses"]  # type: ignore[assignment]
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        # One order for every process: each takes its slice of each global batch.
        order = torch.randperm(
            len(x_train), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch)
        ).to(device)
        progress = Progress(steps_per_epoch, f"epoch {epoch}/{args.epochs}", show and main_process)
        totals = torch.zeros(3, device=device)  # loss sum, correct, samples
        for step in range(steps_per_epoch):
            first = step * args.batch_size + rank * local_batch
            idx = order[first : first + local_batch]
            logits = model(x_train[idx])
            loss = F.cross_entropy(logits, y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                stats = torch.stack(
                    [
                        loss.detach() * len(idx),
                        (logits.argmax(1) == y_train[idx]).sum().float(),
                        torch.tensor(float(len(idx)), device=device),
                    ]
                )
                if distributed:
                    dist.all_reduce(stats)
                totals += stats
                step_losses.append((stats[0] / stats[2]).item())
            progress.update(step + 1, step_losses[-1])
        progress.close()
        model.eval()
        with torch.no_grad():
            test_accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if want_cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        train_loss = (totals[0] / totals[2]).item()
        train_accuracy = (totals[1] / totals[2]).item()
        log["epochs"].append(  # type: ignore[attr-defined]
            {
                "epoch": epoch,
                "loss": train_loss,
                "train_accuracy": train_accuracy,
                "test_accuracy": test_accuracy,
                "seconds": seconds,
            }
        )
        if main_process:
            print(  # noqa: T201
                f"epoch {epoch:>3}/{args.epochs}  loss {train_loss:.4f}  "
                f"train acc {100 * train_accuracy:5.1f}%  test acc {100 * test_accuracy:5.1f}%  "
                f"time {seconds:.2f} s",
                flush=True,
            )
    log["test_accuracy"] = log["epochs"][-1]["test_accuracy"] if args.epochs else None  # type: ignore[index]
    if main_process and args.log_json:
        Path(args.log_json).write_text(json.dumps(log, indent=1))
    if distributed:
        dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
