"""Which global optimizer hooks stepscope keeps: eager, after torch.compile is
called, and after uninstrument(): python optimizer_hooks.py RUN_DIR"""
import sys

import torch
import torch.nn as nn
from torch.optim import optimizer as optim_mod

import stepscope
from stepscope.integrations import torch as st_torch


def kinds():
    hooks = [*optim_mod._global_optimizer_pre_hooks.values(), *optim_mod._global_optimizer_post_hooks.values()]
    return sorted(type(h).__name__ for h in hooks)


def step_outside_the_range():
    """The global hooks run by hand, without torch's Optimizer.step# range around them
    (what a torch without that range would do): only a post-hook can end that step."""
    for hook in list(optim_mod._global_optimizer_pre_hooks.values()):
        hook(opt, (), {})
    for hook in list(optim_mod._global_optimizer_post_hooks.values()):
        hook(opt, (), {})
    return st_torch.instrumentor.loops.local.s.in_optimizer


def train(steps):
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randn(16, 1)
print("dynamo imported", "torch._dynamo" in sys.modules)  # by the optimizer's construction
optimize = torch._dynamo.optimize
stepscope.start(dir=sys.argv[1], name="run")
st_torch.instrument()
print("hooks eager", kinds())
train(4)
print("hooks after eager steps", kinds())  # torch's range ended each step: no post-hook asked for
double = torch.compile(lambda t: t * 2, backend="eager")
print("hooks after compile", kinds())  # the Python pre-hook (torch's range ends each step)
train(3)
print("compiled", double(torch.ones(2)).tolist())
train(1)
print("outside a range, python hooks", kinds(), "open", step_outside_the_range(), "then", kinds())
train(1)
st_torch.uninstrument()
st_torch.instrument()  # again: native, no post-hook until a step asks for one
print("outside a range, native hooks", kinds(), "open", step_outside_the_range(), "then", kinds())
st_torch.uninstrument()
print("hooks after uninstrument", kinds(), "optimize restored", torch._dynamo.optimize is optimize)
stepscope.stop()
