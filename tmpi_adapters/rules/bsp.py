"""BSP: bulk-synchronous parallel SGD, exact in its default form.

``mode=grad`` (default): one fused allreduce of the gradients inside the
compiled graph per step, weighted by each rank's rows, so N ranks take exactly
the step one rank would take on the whole batch (the exchange itself is
:meth:`tmpi_adapters.rules.base.Rule.reduce_gradients`).  ``mode=avg``:
every rank steps on its own gradients and parameters are averaged every
``period`` steps (Theano-MPI's ``avg``).
"""
from tmpi_adapters.options import Knob, one_of, positive
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.rules.base import Rule


class BSP(Rule):
    name = "bsp"
    reduces_linearly = True
    knobs = {
        "mode": Knob(str, "grad", "grad: exchange gradients each step (exact); "
                                  "avg: average parameters between steps",
                     one_of("grad", "avg")),
        "period": Knob(int, 1, "avg mode: average parameters every this many steps", positive,
                       only_with=("mode", "avg")),
    }

    def __init__(self, session, **options):
        super().__init__(session, **options)
        self.exchanges = "gradients" if self.mode == "grad" else "parameters"
        # The exact exchange, which parts can start during backpropagation.
        self.overlaps = self.mode == "grad"

    def after_step(self, model, samples):
        if self.mode == "avg" and model.step % self.period == 0:
            self.average(model.params + model.model_state, weight=samples)

    def finish(self, model):
        if self.mode == "avg" and model.step % self.period != 0:
            self.average(model.params + model.model_state)


@hookimpl
def tmpi_rules():
    return {"bsp": BSP}
