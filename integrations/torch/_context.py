"""What torch's parts (roots, fetches, optimizer hooks, compile, amp, annotations,
workers, operator windows) see of the instrumentor: a few fields and callbacks,
never the instrumentor itself, so each part's reach is written down here."""

from __future__ import annotations


class TorchContext:
    """One per ``instrument()``. ``roots``, ``forwards`` and ``loops`` are set right
    after the context is made (the first two are given it)."""

    __slots__ = ("torch", "compiler", "is_dynamo_compiling", "only_optimizer", "loops", "roots", "forwards",
                 "loaders_seen", "optimizers", "fail", "patch", "replace", "is_on")

    def __init__(self, *, torch, compiler, is_dynamo_compiling, only_optimizer, loaders_seen, optimizers, fail,
                 patch, replace, is_on):
        self.torch = torch
        # torch.compiler.is_compiling() is these two: dynamo folds is_dynamo_compiling() to True
        # while it traces; export sets compiler._is_compiling_flag
        self.compiler = compiler
        self.is_dynamo_compiling = is_dynamo_compiling
        self.only_optimizer = only_optimizer  # id() of the one optimizer to record, or None
        self.loops = None  # _loops.Loops: each thread's loop state
        self.roots = None  # _roots.Roots
        self.forwards = None  # _forward.Forwards
        self.loaders_seen = loaders_seen  # weak references to the DataLoaders iterated before
        self.optimizers = optimizers  # id -> optimizer, those created since (WeakValueDictionary)
        self.fail = fail  # fail(exc): one line, stepscope off, the job goes on
        self.patch = patch  # the instrumentor's patch registry (undone by uninstrument)
        self.replace = replace
        self.is_on = is_on  # () -> whether the instrumentor is on

    def is_compiling(self) -> bool:
        return self.is_dynamo_compiling() or self.compiler._is_compiling_flag
