"""A script's own loop on hpcdp.session that records the samples each rank trains on.

Every rank appends {"step", "ids"} lines to <run.dir>/ids/rank-R.jsonl, the ids read
from the two pixels where tests/parallel/conftest.py's write_split puts each sample's
index. OWN_LOOP_EXTRA=bad puts a value in the extra state that a checkpoint cannot hold;
OWN_LOOP_LOG=1 logs the loss, averaged over ranks, at every even step (session.log).
"""

import json
import os
import sys

import torch
from torch import nn

from hpcdp import session

s = session.start(sys.argv[1:])
reader = s.reader(("x", "y"))
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 4)).to(s.device)
opt = s.optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
extra = {"seen": 0}
if os.environ.get("OWN_LOOP_EXTRA") == "bad":
    extra["lr_rule"] = lambda step: 0.1  # not a value a weights-only load reads back
s.resume(model, [opt], reader, extra)
out = s.cfg.run_dir / "ids"
out.mkdir(parents=True, exist_ok=True)
with open(out / f"rank-{s.rank}.jsonl", "a") as log:
    for epoch in s.epochs(2):
        for x, y in reader:
            ids = (x[:, 0, 0, 0].long() + 256 * x[:, 0, 0, 1].long()).tolist()
            log.write(json.dumps({"epoch": epoch, "step": s.state.step, "ids": ids}) + "\n")
            log.flush()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.float() / 255), y)
            loss.backward()
            opt.step()
            extra["seen"] += len(ids) * s.size
            s.step_done()
            if os.environ.get("OWN_LOOP_LOG") and s.state.step % 2 == 0:
                s.log({"loss": s.average([loss.item()])[0]})
s.finish()
