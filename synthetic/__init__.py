"""The synthetic-ridge simulator's tooling: calibrating its α-β cost model on real Horovod
allreduces (`synthetic.calibrate`), timing workers run under horovodrun/torchrun
(`synthetic.allreduce_timing`, `synthetic.round_timing`), and in-process sweeps whose
results the figures of paper_figs/ read (`synthetic.sweep`).

The simulator itself is `dane.comm.ThreadGroup`, driven by `python -m experiments.simulate`.
"""
