"""Who trains next: the three scheduling rules, pure functions over frozen views (no Ray, no
torch, no engine objects), so each is tested with thousands of random cases.

- ``fair.py``     the kernel's rule: the run its one device trains next (``choose_fair``), and
  which runs to park first when the device is short of memory (``parking_order``).
- ``workers.py``  the workers' rule: the run an idle Ray worker, or gang, trains next
  (``choose_for_worker``).
- ``gangs.py``    the gang rule: at one dispatch of the Ray executor, which gangs to form and
  which worker or gang trains which run, in order (``plan_dispatch``).

The engine (controller.py) and the executors only build the views, act on what a rule returns
and send the chunks.
"""

from rapidfire_nb.engine.scheduling.fair import RunView, choose_fair, parking_order
from rapidfire_nb.engine.scheduling.gangs import (
    Assignment,
    DispatchView,
    GangForm,
    GangView,
    PlacedRun,
    Plan,
    WorkerView,
    plan_dispatch,
)
from rapidfire_nb.engine.scheduling.workers import LAG, choose_for_worker

__all__ = ["LAG", "Assignment", "DispatchView", "GangForm", "GangView", "PlacedRun", "Plan", "RunView",
           "WorkerView", "choose_fair", "choose_for_worker", "parking_order", "plan_dispatch"]
