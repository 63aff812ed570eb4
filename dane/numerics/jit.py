"""numba for the package's compiled kernels: imported once, with its compiles and cache loads marked as start-up.

Every kernel module takes numba from `numba` here rather than importing it.  The import itself and every
compilation or cache load that numba does under its compiler lock then fall in `dane.comm.meters.start_up`:
process start-up, left out of a simulated worker's compute (the module docstring there says why).  Under a
launcher nothing changes: a rank's wall clock holds them, before its first round when the kernel is loaded as
the method is built (`dane.numerics.svrg_kernels.load`).
"""
from __future__ import annotations

import threading

from ..comm.meters import start_up, start_up_begin, start_up_end

#: ``fastmath`` of the kernels that take it: sums may be reassociated (a dot product then vectorizes) and a*b+c fused;
#: no assumption about inf or nan
FASTMATH = {"reassoc", "contract"}

_loaded: list = []  # the numba module, once imported with its listener
_loading = threading.Lock()


def numba():
    """The numba module, imported once with a listener on its compiler lock (module docstring)."""
    with _loading:
        if not _loaded:
            _loaded.append(_import_numba())
    return _loaded[0]


def _import_numba():
    with start_up():
        import numba
        from numba.core import event

        class CompilerLock(event.Listener):
            def on_start(self, ev) -> None:
                start_up_begin()

            def on_end(self, ev) -> None:
                start_up_end()

        event.register("numba:compiler_lock", CompilerLock())
    return numba
