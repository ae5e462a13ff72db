"""Your own model and training loop, with hpcdp's guarantees (docs/your-model.md).

    mpirun -np 2 python examples/own_loop.py data.path=data/digits run.dir=runs/own

The arguments are hpcdp's config keys (run.dir, run.seed, data.path,
data.global_batch_size, checkpoint.every_steps, preempt.*, ...), so the script
resumes where it stopped, on any number of ranks with the same global batch,
and checkpoints, requeues and stops with the trainer under Slurm:

    hpcdp slurm submit --script examples/own_loop.py -- data.path=data/digits
"""

import sys

import torch
from torch import nn

from hpcdp import session

EPOCHS = 3


class Net(nn.Module):
    """A network of the script's own: 8x8 images -> 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(),
                                    nn.Dropout(0.1), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main(argv: list[str]) -> None:
    s = session.start(argv)  # Horovod, the device, the watchdog, the preemption handlers
    reader = s.reader(("x", "y"))  # this rank's shuffled batches of data.path/train.h5
    torch.manual_seed(0)
    model = Net().to(s.device)
    opt = s.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    extra = {"loss_sum": 0.0, "steps": 0}  # the script's own state (rank 0's is kept)
    s.resume(model, [opt], reader, extra)  # the newest checkpoint, or a fresh start
    model.train()
    for epoch in s.epochs(EPOCHS):  # from the resumed epoch, mid-epoch where it stopped
        for x, y in reader:
            x, y = x.to(s.device).float() / 255, y.to(s.device)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)  # dropout draws from the RNG
            loss.backward()  # gradients averaged over ranks
            opt.step()
            extra["loss_sum"] += loss.item()
            extra["steps"] += 1
            s.step_done()  # the beat, the preemption vote, a checkpoint when due
        if s.root:  # rank 0's running loss: what a resume restores exactly
            mean = extra["loss_sum"] / max(extra["steps"], 1)
            print(f"epoch {epoch}: mean loss {mean:.4f} (step {s.state.step})", flush=True)
        extra["loss_sum"], extra["steps"] = 0.0, 0
    s.finish()  # the last checkpoint; every rank exits 0


if __name__ == "__main__":
    main(sys.argv[1:])
