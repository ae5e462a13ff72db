"""A script that keeps its own training loop, with hpcdp's guarantees (docs/your-model.md).

    from hpcdp import session

    s = session.start(sys.argv[1:])            # hpcdp's config keys: run.dir=..., data.path=...
    reader = s.reader(("x", "y"))              # sharded, shuffled, resumable on any world size
    model = Net().to(s.device)
    opt = s.optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    extra = {"seen": 0}                        # the script's own state, checkpointed with it
    s.resume(model, [opt], reader, extra)      # or a fresh start; rank 0's weights everywhere
    for epoch in s.epochs(10):
        for x, y in reader:
            ...                                # forward, backward, opt.step(): the script's own
            s.step_done()                      # watchdog, preemption vote, checkpoint when due
    s.finish()                                 # the last checkpoint; every rank exits 0

What it keeps of the trainer's guarantees: start-up with hpcdp's runtime settings
and GPU placement, the sharded readers' global order on any number of ranks, the
gradient averaging and the broadcast at start and on resume, exact mid-epoch
resume (reader position, every rank's RNG, the extra state), the stall watchdog,
the agreed preemption stop with its checkpoint and requeue, and rank 0's atomic,
keep-k checkpoints loaded without unpickling. What the loop computes (loss,
metrics, validation, the learning rate) is the script's.
"""

from hpcdp.session.core import TASK, Session, configure, start
from hpcdp.train.checkpoints import TrainState

__all__ = ["TASK", "Session", "TrainState", "configure", "start"]
