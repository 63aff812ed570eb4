r"""``comm.compress``: the messages an algorithm declares safe to compress, compressed, and every bit counted.

An algorithm names the kind of each tensor it sends (``comm.allreduce_mean([g, metrics],
kinds=("gradient",))``) and declares on its class which kinds may be compressed
(`dane.algorithm.Algorithm.compressible`).  With ``comm.compress=<spec>`` (`dane.compress.make`)
each worker replaces such a tensor x by what the receiver decodes, C(x) (with
``comm.error_feedback=true``, EF21: the estimate g ← g + C'(x − g), C' = C for a biased C and
C/(ω+1) for an unbiased one, so that C' is contractive); the rest of the message (the logged
metrics, scalars) is sent as it is.

*How it is exchanged, and what the counts mean.*  The decoded values are averaged by the
backend's ordinary dense allreduce: the iterates are exactly those of a parameter server that
receives each worker's compressed message, decodes it and averages, and they are the same on
every backend.  What is counted is that parameter-server exchange, per worker, cumulative:

- ``uplink_bits``: what this worker sent to the server, a compressed tensor at
  `Compressor.bits` (values at their dtype's width, indices, norms) and the rest at
  numel × width;
- ``downlink_bits``: what the server sent this worker, the averaged tensors dense (the mean
  of m sparse messages is not sparse), unless ``comm.compress_down`` names a downlink compressor;

a broadcast counts its payload in the root's uplink and every other worker's downlink.  The
records carry both (with ``comm.compress=none`` too, dense), and the summary the last record's.  The
communicator's ``bytes_sent`` and the simulator's α-β cost price the message at its compressed
size, ⌈bits/8⌉ bytes per compressed tensor, as if it were reduced at that size: optimistic for
a sparse message, whose ring reduction densifies, and, without a downlink compressor, for the dense downlink.

*The run's measurements are not the method's bits.*  A tensor of kind `METRICS` is the run's measurement of the
iterate, only logged: the objective, suboptimality and test metrics of `dane.problems.Problem.evaluate` (and a
gradient sent only for its logged norm) that ride a round's allreduce to save a latency.  It goes up and comes back
dense, and ``bytes_sent`` and the α-β cost price it as every other tensor (it is on the wire), but neither
``uplink_bits`` nor ``downlink_bits`` counts it: they count the method's messages as its paper counts them, so that
a run with a reference optimum (one metric more) is charged what the same run without one is.  A value the method's
round itself reads (DANE's safeguard reads the objective, GIANT's line search too) is its message, sent as another
kind, and counted.

*The downlink* (``comm.compress_down=<spec>``, the same grammar; it needs ``comm.compress``, ``none`` for an
uncompressed uplink).  The server compresses its reply too: each averaged tensor of a compressible kind goes
down as D(mean) (with ``comm.error_feedback=true``, EF21 at the server: its estimate v ← v + D'(mean − v), every
worker keeping the same v), the rest of the reply dense.  D draws from the server's generator, seeded from the
run's seed alone (`downlink_seed`): every worker holds a copy of it and, receiving the same mean, decodes the same
message, so the iterates stay identical on every worker and every backend.  The methods whose downlink is the
averaged message of a compressible kind take it: ``gd``, ``dane`` and ``inexact_dane`` (the mean gradient; DANE's
averaged iterate goes down exactly).  ``downlink_bits`` then counts D's bits (`Compressor.bits`) for those tensors, dense for the
rest, and the cost model charges both directions at their sizes: the ring's reduce-scatter at the uplink's
bytes and its allgather at the downlink's, (m−1)/m·(n_up + n_down)/β + 2(m−1)α (`dane.comm.cost.AlphaBeta`),
``bytes_sent`` the same share.  Without ``comm.compress_down`` every count, price and iterate is as before.
A method that compresses its own reply (EF21-P: the model's shift, `baselines.ef21p`) installs this counter with
its downlink compressor and ``own_downlink=True``: the reply is counted at D's bits and passed on as it is.

A compressed round's logged ``grad_norm`` is that of the decoded mean gradient, the one the method
steps with; the objective and suboptimality ride uncompressed, and uncounted (`METRICS`).

*A method that owns its compressor* (``algorithm=diana``, ``adiana``, ``marina``, ``dasha``, ``ef21``:
`dane.algorithm.Algorithm`'s ``compressed_messages``) installs this counter itself, with ``precompressed=True``
where it compresses its messages itself (DIANA, ADIANA, MARINA and DASHA keep what they sent: the shifts learn from
it): a tensor of a named kind is then counted at `Compressor.bits`, as above, and passed on as it is, never
compressed a second time.  Such a method refuses ``comm.compress`` (`dane.loop.spec.refuse_compression`).

Randomness: one `torch.Generator` per worker seeded from the run's seed and the rank (the
server, knowing the seeds, draws RandK's indices itself: they are not sent), checkpointed with
the EF21 estimates in the algorithm's state.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..compress import Compressor, ErrorFeedback
from ..seeds import STREAMS, keyed_seed, shared_seed

COMPRESS_STREAM = STREAMS["compression"].number  # the workers' compression generators (`compression_seed`)
DOWNLINK_STREAM = STREAMS["downlink"].number  # the server's downlink generator (`downlink_seed`)
#: the kind of a tensor that is the run's measurement, only logged (module docstring): sent dense, priced in
#: ``bytes_sent`` and the cost model, left out of ``uplink_bits`` and ``downlink_bits``
METRICS = "metrics"


def compression_seed(seed: int, rank: int) -> int:
    """Worker ``rank``'s 63-bit compression seed, from the run's seed and the rank alone (`dane.seeds.keyed_seed`: as a
    list, ``[seed, 11, rank]`` was worker 11's seed of worker stream ``rank``, so worker 11's SVRG drew worker 5's
    compressor's numbers)."""
    return keyed_seed(seed, COMPRESS_STREAM, rank)


def downlink_seed(seed: int) -> int:
    """The server's 63-bit downlink compression seed, from the run's seed alone (every worker holds a copy)."""
    return shared_seed(seed, DOWNLINK_STREAM)


def message_bits(tensors: Sequence[torch.Tensor]) -> int:
    """Bits of tensors sent dense, at their dtype's width."""
    return sum(t.numel() * t.element_size() * 8 for t in tensors)


class MessageCompression:
    """One worker's compression of its outgoing messages (and, with ``downlink``, of the server's reply to it), and
    its uplink and downlink bit counters.  ``down_bytes``: the last reply's bytes at its compressed size, None
    without a downlink compressor (the cost model then prices the reply as before)."""

    def __init__(self, compressor: Compressor, kinds: Sequence[str], *, error_feedback: bool = False,
                 seed: int = 0, rank: int = 0, precompressed: bool = False, downlink: Compressor | None = None,
                 own_downlink: bool = False):
        self.compressor = compressor
        self.kinds = tuple(kinds)
        self.error_feedback = error_feedback
        self.precompressed = precompressed  # the sender compressed these kinds itself: count them, pass them on
        self.downlink = downlink
        self.own_downlink = own_downlink  # the method compresses its reply itself (EF21-P): count it, pass it on
        self.generator = torch.Generator().manual_seed(compression_seed(seed, rank))
        self.server_generator = torch.Generator().manual_seed(downlink_seed(seed))  # the server's, on every worker
        self.feedback: dict[str, ErrorFeedback] = {}
        self.uplink_bits = 0
        self.downlink_bits = 0
        self.down_bytes: int | None = None

    def encode(self, tensors: list[torch.Tensor], kinds: Sequence[str | None]) -> tuple[list[torch.Tensor], int]:
        """(what the server decodes of each tensor, the message's bytes at its compressed size); counts the bits
        of one allreduce: the message up, the dense mean down, a `METRICS` tensor in the bytes and not the bits."""
        decoded, bits, nbytes = [], 0, 0
        kinds = list(kinds) + [None] * (len(tensors) - len(kinds))
        seen: dict[str, int] = {}
        for tensor, kind in zip(tensors, kinds):
            width = tensor.element_size() * 8
            if kind is not None and kind in self.kinds and tensor.numel() > 0:
                seen[kind] = seen.get(kind, -1) + 1
                decoded.append(tensor if self.precompressed else self._compress(f"{kind}.{seen[kind]}", tensor,
                                                                                self.compressor, self.generator))
                sent = self.compressor.bits(tensor.numel(), width)
                bits, nbytes = bits + sent, nbytes + math.ceil(sent / 8)
            else:
                decoded.append(tensor)
                bits += 0 if kind == METRICS else tensor.numel() * width
                nbytes += tensor.numel() * tensor.element_size()
        self.uplink_bits += bits
        if self.downlink is None:
            self.downlink_bits += message_bits([t for t, kind in zip(tensors, kinds) if kind != METRICS])
        else:
            self.count_down(tensors, kinds)
        return decoded, nbytes

    def count_down(self, tensors: list[torch.Tensor], kinds: Sequence[str | None]) -> None:
        """The server's reply of an allreduce: the means of the compressible kinds at the downlink compressor's
        bits, the rest dense (a `METRICS` tensor in `down_bytes` and not the bits); sets `down_bytes`."""
        bits, nbytes = 0, 0
        for tensor, kind in zip(tensors, kinds):
            if kind is not None and kind in self.kinds and tensor.numel() > 0:
                sent = self.downlink.bits(tensor.numel(), tensor.element_size() * 8)
                bits, nbytes = bits + sent, nbytes + math.ceil(sent / 8)
            else:
                bits += 0 if kind == METRICS else message_bits([tensor])
                nbytes += tensor.numel() * tensor.element_size()
        self.downlink_bits += bits
        self.down_bytes = nbytes

    def decode_down(self, means: list[torch.Tensor], kinds: Sequence[str | None]) -> list[torch.Tensor]:
        """What every worker decodes of the server's reply: D(mean) for a compressible kind (EF21's server estimate
        under ``error_feedback``), the rest as averaged; as it is without a downlink compressor or when the method
        compressed it itself (``precompressed``, ``own_downlink``)."""
        if self.downlink is None or self.precompressed or self.own_downlink:
            return means
        kinds = list(kinds) + [None] * (len(means) - len(kinds))
        decoded, seen = [], {}
        for mean, kind in zip(means, kinds):
            if kind is not None and kind in self.kinds and mean.numel() > 0:
                seen[kind] = seen.get(kind, -1) + 1
                decoded.append(self._compress(f"down.{kind}.{seen[kind]}", mean, self.downlink,
                                              self.server_generator))
            else:
                decoded.append(mean)
        return decoded

    def _compress(self, key: str, tensor: torch.Tensor, compressor: Compressor,
                  generator: torch.Generator) -> torch.Tensor:
        flat = tensor.reshape(-1)
        if self.error_feedback:
            if key not in self.feedback:
                self.feedback[key] = ErrorFeedback(compressor)
            out = self.feedback[key](flat, generator)
        else:
            out = compressor(flat, generator)
        return out.reshape(tensor.shape)

    def count_broadcast(self, tensors: list[torch.Tensor], root: bool) -> None:
        bits = message_bits(tensors)
        if root:
            self.uplink_bits += bits
        else:
            self.downlink_bits += bits

    def record(self) -> dict[str, int]:
        return {"uplink_bits": self.uplink_bits, "downlink_bits": self.downlink_bits}

    def restore(self, cost: dict) -> None:
        """Go on from a checkpoint's counters (a cost dict without them: from 0)."""
        self.uplink_bits = int(cost.get("uplink_bits", 0))
        self.downlink_bits = int(cost.get("downlink_bits", 0))

    def summary(self) -> dict:
        """The summary's ``compression`` (its bit totals are the last record's, `dane.loop.driver.base_summary`)."""
        summary = {"compress": self.compressor.spec, "error_feedback": self.error_feedback,
                   "compressed_messages": list(self.kinds)}
        return summary if self.downlink is None else {**summary, "compress_down": self.downlink.spec}

    def state_dict(self) -> dict:
        state = {"generator": self.generator.get_state(),
                 "feedback": {key: ef.state_dict() for key, ef in self.feedback.items()}}
        return state if self.downlink is None else {**state, "server_generator": self.server_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        if "server_generator" in state:
            self.server_generator.set_state(state["server_generator"])
        self.feedback = {}
        for key, ef_state in state["feedback"].items():
            compressor = self.downlink if key.startswith("down.") else self.compressor
            self.feedback[key] = ErrorFeedback(compressor)
            self.feedback[key].load_state_dict(ef_state)
