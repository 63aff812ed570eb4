"""Split learning: one network cut between m agents (the data holders) and a server (docs/split_learning.md).

``algorithm=split`` (conf/algorithm/split.yaml) on any network problem.  Agent a holds
its rows and a copy of the bottom (the model up to and including ``algorithm.cut``);
the server holds the top.  A step on agent a's minibatch: the agent sends h =
bottom(x_B) (and y_B), the server steps the top on the loss and returns ∂ℓ/∂h, the agent
backpropagates and steps the bottom.  ``schedule=sequential``: agents take turns and
hand the bottom with its optimizer state to the next agent; ``splitfed``: parallel
bottoms, the server serves their batches in turn, bottoms averaged by rows at each
epoch's end.  ``labels=agent`` is U-shaped: the agent also keeps the last layer and the
loss.

Invariants (float64, tests/test_split.py): sequential split training is plain minibatch
SGD on the uncut network over the agents' minibatches in turn order, to round-off (one
agent too); U-shaped equals labels at the server; SplitFed with one agent equals
sequential; a torchrun run equals the simulator.  Bytes per epoch, with N rows, cut width
|h| and B-row batches, in values of the run's dtype: activations and cut gradients |h|·N
each (U-shaped, plus the server's output |z|·N each way), labels N int64 (8·N bytes;
none U-shaped), hand-overs m·(|agent part| + |its optimizer state|) for sequential with
m > 1 (the last back to agent 0), 2m·|agent part| for SplitFed, where |agent part| =
|bottom| (+ |head| when U-shaped).  The parties run on the CPU (``problem.device=cuda``
is refused; ``auto`` means the CPU here).

Modules, by role: `cut` (cut names, the parts, each cut's share of the parameters),
`parties` (an agent's and the server's step, the hand-over snapshot), `links` (messages
counted per kind, in one process or between processes), `protocol` (one epoch, written
once for every party), `training` (the parties from a `RunSpec`, rank 0's round object,
the followers' loop), `run` (the simulator and torchrun drivers; `dane.loop.launch` calls
`run.run_split`), `config` (`SplitConfig`).
"""
