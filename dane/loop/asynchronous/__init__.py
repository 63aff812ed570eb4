"""Asynchronous and stale-synchronous (SSP) training through a parameter server.

``comm.staleness = s``:

- ``s = inf``: fully asynchronous.  Each worker loops pull -> step -> push and never waits
  for the others;
- ``0 < s < inf``: stale-synchronous parallel (Ho et al., NIPS 2013).  A worker's *clock*
  counts its pushes; it may start its next step only while its clock is at most ``s``
  ahead of the slowest worker's.  Otherwise the server holds its pull reply until the
  slowest worker has caught up;
- ``s = 0`` is the synchronous algorithm, which never comes here (`dane.loop.launch.execute`).

The math is the algorithm's own: on every worker ``worker_update(w)`` is one step at the
parameters it pulled (sync_sgd: a minibatch gradient; local_sgd: K local steps, pushed
as the change), and the server (``async_server``) applies each push as it arrives
(sync_sgd: ``w <- opt.step(w, g_i)`` with the synchronous run's optimizer; local_sgd:
``w <- w + share_i * delta_i``).

A logged round is ``m * updates_per_round`` server updates: as many gradients as one
synchronous round uses.  Record t describes the server's iterate after t such rounds.
``bytes_sent`` and ``comm_rounds`` are per worker (the workers' mean).
``staleness_max``, ``staleness_mean`` and ``clock_lead_max`` describe round t's own
updates, which lead from w_t to w_{t+1}.  A simulated and a real run write the same
records, summary and ``updates.jsonl``.

The modules, by role:

- `updates`: the server's update log and its statistics (both kinds of run);
- `simulator`: the event-driven simulator (``workers=m sim.topology=ps`` under plain
  python), on a modelled clock, so the update order depends only on the seed;
- `protocol`: a real run's messages (``torchrun ... comm=ps``, one server): the workers'
  push loop and the server's, on tags of their own beside `dane.comm.ps`'s synchronous
  protocol.  It lives here, not in `dane.comm`, because it is a run, not a collective:
  the server builds the algorithm's server half and stops after the run's rounds;
- `replay`: a real run's worker side, which turns the iterates the server kept into the
  records of an ordinary run.

This package sits with the run (`dane.loop.worker`, `dane.loop.launch`), above `dane.comm`;
`dane.loop.launch` imports its modules when a run is asynchronous.
"""
