"""torch.compile jobs for tests/test_compilation.py: python compile_jobs.py KIND.

recompile  a compiled model (aot_eager) whose forward has a data-dependent branch (a graph
           break) and whose batch size changes at step 10 (a recompile of forward and of the
           code after the break), 30 steps
healthy    the same model without the branch, one batch size: compiled once, 30 steps

Prints ``graphs <n> recompiles <n>`` from dynamo's own counters: the job's compiles,
the same with and without stepscope.
"""
import sys

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, branch):
        super().__init__()
        self.a, self.b, self.branch = nn.Linear(32, 32), nn.Linear(32, 1), branch

    def forward(self, x):
        h = self.a(x)
        if self.branch and h.sum() > 0:  # data-dependent: a graph break
            h = h * 2
        return self.b(h)


def main(kind):
    import torch._dynamo.utils as dynamo_utils

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net(branch=kind == "recompile")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="aot_eager")
    for i in range(30):
        batch = 32 if kind == "healthy" or i < 10 else 48
        opt.zero_grad()
        compiled(torch.randn(batch, 32)).pow(2).mean().backward()
        opt.step()
    metrics = dynamo_utils.get_compilation_metrics()
    print("graphs", dynamo_utils.counters["stats"]["unique_graphs"],
          "recompiles", sum(1 for m in metrics if m.recompile_reason))


if __name__ == "__main__":
    main(sys.argv[1])
