"""A template integration: copy this folder to add one (docs/design.md, "Adding an integration").

It instruments ``myframework``, a made-up framework with the shape most have:

    import myframework                                   # __version__ = "1.2"
    model = myframework.Model(...)                       # model.training: train or eval mode
    optimizer = myframework.Optimizer(...)
    for batch in myframework.DataLoader(data):           # each __next__ fetches a batch
        loss = model(batch)                              # Model.__call__: the forward
        optimizer.step()

An integration only reports what it sees -- a batch fetched, a forward, an
optimizer step -- to a ``StepTracker`` (integrations/_steps.py): the tracker
decides where steps begin and end (SPEC §3) and records the phase spans itself.
It follows the contract of integrations/_base.py: every patch goes through
``self.patch`` (``uninstrument()`` restores it), a failure turns stepscope off
and never reaches the job. This folder is never registered as an entry point
(tests/test_template_integration.py builds a toy integration from it).
"""

from __future__ import annotations

from stepscope.core import session
from stepscope.core.recording import now
from stepscope.integrations._base import Instrumentor
from stepscope.integrations._frameless import frameless
from stepscope.integrations._steps import StepTracker

FAILED = "the myframework integration failed"  # the one line printed if a report fails


class MyFrameworkInstrumentor(Instrumentor):
    name = "myframework"          # in messages
    module = "myframework"        # its __version__ is checked against `supported` before any patch
    distribution = "myframework"  # where the version is read when the module has no __version__
    supported = ">=1.0,<2"        # the versions this integration was written for

    def __init__(self):
        super().__init__()
        self.tracker = StepTracker()

    def _instrument(self) -> None:
        # Import the framework here, never at module level: `import stepscope` stays light,
        # and zero-edit start calls this right after the script imported it.
        import myframework

        tracker = self.tracker = StepTracker()  # one loop: one tracker (a loop per thread: one each)

        # frameless(original, before, after): a C wrapper that leaves no frame in the user's
        # tracebacks. before(*args, **kwargs) returns (args, kwargs, token) to time the call
        # (None: call it untimed); after(token, exc) runs once it returned or raised.
        def fetch_begins(loader):
            return (loader,), {}, now()

        def fetch_ended(t0, exc):
            if exc is None:
                tracker.fetched(t0, now(), None)  # its mode: the work on the batch tells
            elif isinstance(exc, StopIteration):
                tracker.exhausted(t0)  # the loader ran out: the loop's last step ends

        def forward_begins(model, *args, **kwargs):
            mode = "train" if getattr(model, "training", True) else "eval"
            t0 = now()
            tracker.forward_started(mode, t0)
            return (model, *args), kwargs, (mode, t0)

        def forward_ended(token, exc):
            mode, t0 = token
            tracker.forward_ended(mode, t0, now())

        def optimizer_created(token, exc):
            if exc is None:
                tracker.optimizer_known(token)  # a train step completes at its optimizer step

        def optimizer_step_begins(optimizer, *args, **kwargs):
            t0 = now()
            tracker.optimizer_started(id(optimizer), t0)
            return (optimizer, *args), kwargs, (id(optimizer), t0)

        def optimizer_step_ended(token, exc):
            key, t0 = token
            tracker.optimizer_ended(key, t0, now())

        def timed(before, after):
            return lambda original: frameless(original, before, after, FAILED)

        self.patch(myframework.DataLoader, "__next__", timed(fetch_begins, fetch_ended))
        self.patch(myframework.Model, "__call__", timed(forward_begins, forward_ended))
        self.patch(myframework.Optimizer, "__init__",
                   timed(lambda opt, *a, **k: ((opt, *a), k, id(opt)), optimizer_created))
        self.patch(myframework.Optimizer, "step", timed(optimizer_step_begins, optimizer_step_ended))
        session.on_stop(self._close_steps)  # the last step ends before the trace is closed

    def _uninstrument(self) -> None:
        """Undo what the patch registry does not know (here: the open step)."""
        self.tracker.close()

    def _close_steps(self) -> None:
        if self.is_instrumented():
            self.tracker.close()


# What the entry point names (pyproject.toml of the package that ships it):
#   [project.entry-points."stepscope.instrumentors"]
#   myframework = "my_package.stepscope_myframework:instrumentor"
instrumentor = MyFrameworkInstrumentor()


def instrument() -> bool:
    """Explicit use, without zero-edit start: True when it is on."""
    return instrumentor.instrument(stacklevel=3)


def uninstrument() -> None:
    instrumentor.uninstrument()
