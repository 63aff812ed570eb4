r"""Side by side with FedNL-Public (Rustem-Islamov/FedNL-Public, the FedNL papers' NumPy code): DIANA, ADIANA,
FedNL-CR, NL1 and DINGO run in its ``methods.py`` (imported from ``--reference``, unchanged) and in the package (the
per-worker in-process simulator, one thread a client: `dane.comm.ThreadGroup` and `dane.loop.runner.run`) on the
same shards; per method and round the relative iterate difference ‖x_ref − x_dane‖_∞/‖x_ref‖_∞ and the bits each
counts, as JSON (with the reference's commit, the machine and the load).

    python -m scripts.peers.fednl_public --reference /tmp/fednl_public [--dataset phishing --clients 4 --rows 100]

*Shards*: the reference's ``utils.read_data`` reads the first n·m rows of ``$DANE_DATA_DIR/libsvm/<dataset>``
(labels ±1); client i holds rows i·m .. (i+1)·m − 1, as the reference slices them.  *Loss*: its ``LogReg`` and
``loss_logistic``, (1/N)Σ_j log(1 + exp(−b_j a_jᵀx)) + (λ/2)‖x‖², is ``problem=logreg`` with client weight 1/m
(O_i = (1/m)Σ_{j∈i} f_j + (λ/2)‖x‖², O their mean); x⁰ = 0 in both.
*Parameters* (reference → package): DIANA ``arg.eta, alpha`` (its rules at ``arg.L`` = max_i L_i) → ``lr, alpha``;
ADIANA ``arg.eta, prob, alpha, lamda, theta_1, gamma, beta`` → ``lr, p, alpha, mu, theta1, gamma, beta``; vector
compressor ``no_comp`` → ``none``, ``rand_sparse`` r → ``randk:r``; FedNL-CR ``TopK`` k, ``upd_rule=2``,
``init='nonzero'`` → ``variant=cr, compressor=topk:k`` (α = 1, H_i⁰ = ∇²O_i(x⁰), M by the same L_* rule); NL1
``k``, ``eta=None`` (k/m), ``H`` = α(x⁰) → ``k`` (η null: K/n_i); DINGO θ, φ, ρ → the same keys, defaults alike.
*Randomness and ties*: RandK's indices (DIANA, ADIANA, ``nl1_randk``) and ADIANA's coin are the package's streams,
handed to the reference by rebinding its names ``rand_sparse``, ``random_k`` and ``bernoulli`` (its arithmetic
unchanged); its ``TopK``, which keeps the larger (i, j) of entries tied at the k-th magnitude, is rebound to the
package's TopK on the packed triangle, which keeps the lower (`dane.compress.TopK`'s rule).
*Isolating runs*: FedNL-CR on one client (its H_i update's departure moot) and with M = 0 (``get_M`` overridden:
no cubic solve); DINGO's round from each of the reference's iterates.  tol = −inf: both run ``--rounds`` rounds.
*Bits*: the reference counts one node's, 32 bits a value, from a leading 1 (dropped here); the package 64 a value,
DIANA/ADIANA's ``uplink_bits`` per worker (the logged metrics riding along not counted:
`dane.comm.compression.METRICS`), the others' ``clients_uplink_bits`` summed over
the clients: a value the reference counts as 32 bits is 64 in the package (``NOTES`` says where the messages
counted differ).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import scipy.sparse
import torch

from dane.baselines.adiana import ADIANAConfig
from dane.baselines.diana import DIANAConfig
from dane.baselines.dingo import DINGOConfig
from dane.baselines.fednl import FedNLConfig
from dane.baselines.marina import coin_generator
from dane.baselines.nl1 import NL1Config
from dane.comm import ThreadGroup
from dane.comm.compression import compression_seed
from dane.compress import make
from dane.losses import LOSSES
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.problems.glm import LinearModelShard, to_torch
from dane.problems.stacked_compress import randk_indices
from dane.problems.stacked_hessians import pack, unpack
from dane.synthetic.bench_file import machine
from scripts.harness import load, now

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"phishing": ["1", "0"]}  # read_data's (positive, negative) label strings; the others' are +1/-1
SEED = 0
NOTES = {  # why the iterates or the bits differ, where they do
    "diana": "bits: the reference 32 a value; uplink_bits one worker's, 64 a value (the logged objective not "
             "counted since the run's measurements left the bits)",
    "adiana": "bits as DIANA's, but the reference counts one compressed vector a round (compute_bit once) where "
              "two go up (Q at x^k and at w^k); the package counts both",
    "fednl_cr": "the reference departs from its paper twice: its H_i update runs after the loop over the clients "
                "(only the last client's H_i learns) and its cubic solver solves t = sum (Ug)_i^2/(l_i + M t/2)^2 "
                "(U g for U^T g) and steps with the shift M sqrt(t)/2; the package follows the paper. U g, unlike "
                "U^T g, changes with the signs of U's columns, which np.linalg.svd leaves to LAPACK: these rows "
                "depend on the LAPACK build (the machine's lapack). bits: the reference's TopK 32 a value, no "
                "indices; the package 64 + ceil(log2 T) an entry",
    "fednl_cr_one_client": "one client of all the rows: the H_i update's departure gone, the solver's left (and "
                           "with it the dependence on the LAPACK build)",
    "fednl_cr_one_client_M0": "one client, M = 0 on both sides (the reference's get_M overridden): its step is "
                              "-(H + l I)^-1 g, no cubic solve; both departures gone. topk_tie_rounds: the rounds "
                              "whose TopK met entries tied at the k-th magnitude, which the reference breaks "
                              "toward the larger (i, j) and the package toward the lower; its TopK is rebound to the "
                              "package's here, so the two keep the same entries",
    "nl1": "bits: the same messages, 32 a value in the reference, 64 in the package",
    "dingo": "the reference caps the step at 1e-2 in its first four rounds and floors it at 2^-10, which the paper "
             "and the package do not; one_round_from_reference_iterates: the package's round from the reference's "
             "x_k against its x_(k+1). bits: the reference counts both directions at 32, the package the uplink "
             "at 64",
}


def reference(folder: str):
    """FedNL-Public's modules (methods, oracles, utils), loaded from ``folder``'s files under their own names, without
    touching sys.path: ``methods.py`` imports ``utils`` by that name, so each goes into sys.modules before the next
    runs; refused in one line where it is not that repository."""
    root = Path(folder).resolve()
    modules = {}
    for name in ("utils", "oracles", "methods"):
        path = root / f"{name}.py"
        if not path.is_file():
            raise SystemExit(f"error: {folder}/{name}.py not found; fetch github:Rustem-Islamov/FedNL-Public and pass "
                             f"its folder as --reference")
        spec = importlib.util.spec_from_file_location(name, path)
        modules[name] = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    return modules["methods"], modules["oracles"], modules["utils"]


def git_line(folder: str, *args: str) -> str | None:
    """``git -C folder args``'s one line of output; None where git fails or is absent."""
    try:
        done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True)
    except OSError:
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def reference_commit(folder: str, toplevel: str | None, head: str | None, given: str | None):
    """(commit, commit_source) to record for the reference in ``folder``: git's ``head`` where ``folder`` is the top
    of its own work tree (``toplevel``: ``git rev-parse --show-toplevel`` there; a folder inside another repository
    would name that one's HEAD), and there a ``given`` --commit must be that head (refused in one line otherwise);
    elsewhere ``given`` as given, or (None, None)."""
    if toplevel is not None and head is not None and Path(toplevel).resolve() == Path(folder).resolve():
        if given is not None and given != head:
            raise SystemExit(f"error: --commit {given} is not --reference {folder}'s HEAD {head}; check out "
                             f"{given} there, or drop --commit")
        return head, "git"
    return (given, "given") if given is not None else (None, None)


def package(config, A, b, n, lam, rounds, start=None):
    """Iterates x_0..x_R and records of ``config`` on n threads, client i's rows i·m .. (i+1)·m − 1, from ``start``
    (default 0)."""
    m = len(b) // n
    shards = [LinearModelShard(to_torch(scipy.sparse.csr_matrix(A[i * m:(i + 1) * m])),
                               torch.from_numpy(b[i * m:(i + 1) * m]), LOSSES["logistic"], l2=lam, weight=1 / m)
              for i in range(n)]
    for shard in shards if start is not None else ():
        shard.initial_point = lambda: torch.from_numpy(start.copy())

    def worker(comm):
        algo = config.build(shards[comm.rank], comm)
        iterates = [algo.iterate.clone()]
        records, _ = run(algo, StopRule(rounds=rounds), lambda record: iterates.append(algo.iterate.clone()))
        return [w.numpy() for w in iterates[:len(records)]], records

    return ThreadGroup(n).run(worker)[0]


def randk_draws(n, r, calls_per_round):
    """The reference's ``rand_sparse(x, arg)`` drawing each worker's RandK from that worker's package stream, in the
    order both call it (worker by worker, ``calls_per_round`` draws each)."""
    compressor, count = make(f"randk:{r}"), [0]
    streams = [torch.Generator().manual_seed(compression_seed(SEED, i)) for i in range(n)]

    def rand_sparse(x, arg):
        worker = (count[0] // calls_per_round) % n
        count[0] += 1
        return compressor(torch.from_numpy(np.array(x, dtype=np.float64)), streams[worker]).numpy()

    return rand_sparse


def nl1_draws(n):
    """The reference's ``random_k(x, k)`` with the package NL1's indices (client by client, one draw a round)."""
    count = [0]

    def random_k(x, k):
        client, draw = count[0] % n, count[0] // n
        count[0] += 1
        out = np.zeros(len(x))
        picked = randk_indices(SEED, np.array([client]), draw, len(x), k)[0]
        out[picked] = x[picked] * len(x) / k
        return out

    return random_k


def relative(a, b) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-300))


def compare(ref_x, ref_bits, pkg, bits_key, clients, note):
    """Per round k = 0..R: ‖x_ref − x_dane‖_∞/‖x_ref‖_∞; the bits, cumulative as each records them (the reference's
    after k rounds; the package's record k: what reaching x_k cost, before round k), and each round's increment
    (the package's per client)."""
    xs, records = pkg
    diff = [relative(a, b) for a, b in zip(ref_x, xs)]
    pkg_bits = [int(r.get(bits_key, 0)) for r in records]
    per = 1 if bits_key == "uplink_bits" else clients
    return {"max_rel_diff": max(diff), "rel_diff": diff, "reference_bits": [int(v) for v in ref_bits],
            "package_bits": pkg_bits, "package_bits_key": bits_key,
            "round_bits": {"reference": int(ref_bits[2] - ref_bits[1]),
                           "package_per_client": (pkg_bits[2] - pkg_bits[1]) // per},
            "note": note}


class Sides:
    """The reference's modules and the shards both sides run on; ``seen`` the points the reference evaluates its
    objective at, in order (its iterates: ``NL1`` alone returns them)."""

    def __init__(self, modules, A, b, n, lam, rounds):
        self.methods, self.oracles, self.utils = modules
        self.A, self.b, self.n, self.lam, self.R = A, b, n, lam, rounds
        self.d, self.x0, self.seen = A.shape[1], np.zeros(A.shape[1]), []
        m = len(b) // n
        self.L = max(np.linalg.eigvalsh(A[i * m:(i + 1) * m].T @ A[i * m:(i + 1) * m])[-1] / (4 * m)
                     for i in range(n)) + lam  # max_i L_i, DIANA's and ADIANA's arg.L
        self.methods.loss_logistic = self.loss_logistic

    def loss_logistic(self, X, y, w, arg):  # DIANA and ADIANA evaluate their iterate (ADIANA's y^k) once a round
        self.seen.append(np.array(w, dtype=np.float64))
        return self.utils.loss_logistic(X, y, w, arg)

    def oracle(self, nodes):
        seen = self.seen
        seen.clear()

        class Recorded(self.oracles.LogReg):
            def function_value(self, x):
                seen.append(np.array(x, dtype=np.float64))
                return super().function_value(x)

        o = Recorded(self.A, self.b, self.lam, nodes, len(self.b) // nodes)
        o.set_optimum(np.zeros(self.d))  # its f_opt: tol = -inf runs every round
        return o

    def package(self, config, nodes=None, rounds=None, start=None):
        return package(config, self.A, self.b, nodes or self.n, self.lam, rounds or self.R, start)

    def diana_family(self, out):
        """DIANA and ADIANA with no_comp and rand_sparse (r = d/10), the reference's RandK and coin the package's."""
        methods, n, R = self.methods, self.n, self.R
        for comp in ("no_comp", "rand_sparse"):
            r = max(1, self.d // 10)
            arg = SimpleNamespace(lamda=self.lam, L=self.L, node=n, comp_method=comp, T=R, r=r)
            spec = "none" if comp == "no_comp" else f"randk:{r}"
            self.seen.clear()
            methods.compression_dic["rand_sparse"] = randk_draws(n, r, 1)
            _, bits = methods.diana(self.A, self.b, self.x0.copy(), arg, -np.inf, tol=-np.inf, verbose=False)
            cfg = DIANAConfig(compressor=spec, lr=arg.eta, alpha=arg.alpha, seed=SEED)
            out[f"diana_{spec}"] = compare(self.seen[:R + 1], bits - 1, self.package(cfg), "uplink_bits", n,
                                           NOTES["diana"])
            self.seen.clear()
            methods.compression_dic["rand_sparse"] = randk_draws(n, r, 2)
            coin = coin_generator(SEED)
            methods.bernoulli = SimpleNamespace(rvs=lambda p: coin.random() < p)
            _, bits = methods.adiana(self.A, self.b, self.x0.copy(), arg, -np.inf, tol=-np.inf, verbose=False)
            cfg = ADIANAConfig(compressor=spec, lr=arg.eta, p=arg.prob, alpha=arg.alpha, mu=self.lam,
                               theta1=arg.theta_1, gamma=arg.gamma, beta=arg.beta, seed=SEED)
            out[f"adiana_{spec}"] = compare(self.seen[:R + 1], bits - 1, self.package(cfg), "uplink_bits", n,
                                            NOTES["adiana"])

    def fednl_cr(self, out, topk):
        """FedNL-CR as the reference runs it, on one client, and on one client with M = 0."""
        methods, ties = self.methods, []

        def TopK(X, k):  # noqa: N802 -- the package's rule on the packed triangle, noting ties at the k-th magnitude
            packed = pack(np.asarray(X, dtype=np.float64))
            v = np.sort(np.abs(packed))[::-1]
            ties.append(bool(k < len(v) and v[k - 1] == v[k] > 0))
            kept = unpack(make(f"topk:{k}")(torch.from_numpy(packed)).numpy(), len(X))
            return kept, 2 * k / (len(X) * (len(X) + 1))  # and δ, as the reference's TopK returns them

        methods.TopK = TopK
        for name, nodes, M in (("fednl_cr", self.n, None), ("fednl_cr_one_client", 1, None),
                               ("fednl_cr_one_client_M0", 1, 0.0)):
            cls = methods.FedNL_CR if M is None else type("FedNL_CR_M", (methods.FedNL_CR,), {"get_M": lambda s: M})
            ties.clear()
            _, bits, _ = cls(self.oracle(nodes)).method(self.x0.copy(), topk, hes_comp_name="TopK", init="nonzero",
                                                        upd_rule=2, max_iter=self.R - 1, tol=-np.inf, verbose=False)
            ref_x = [self.seen[1]] + self.seen[2 + nodes:]  # seen: x_opt, x0, x0 once a node (init_cost), x1, ...
            cfg = FedNLConfig(compressor=f"topk:{topk}", variant="cr", cubic=M, seed=SEED)
            out[name] = compare(ref_x, bits[nodes:], self.package(cfg, nodes), "clients_uplink_bits", nodes,
                                NOTES[name])
            out[name]["topk_tie_rounds"] = [r + 1 for r, tie in enumerate(ties) if tie]  # first moves x_(r+2)

    def nl1(self, out, m):
        """NL1 with K = m (every coefficient: no draw) and K = 5 (the package's indices)."""
        for name, k in (("nl1", m), ("nl1_randk", 5)):
            self.methods.random_k = nl1_draws(self.n)
            o = self.oracle(self.n)
            _, bits, xs = self.methods.NL1(o).method(self.x0.copy(), [o.alphas(self.x0, i) for i in range(self.n)],
                                                     max_iter=self.R - 1, k=k, tol=-np.inf, verbose=False)
            out[name] = compare([xs[0]] + list(xs[2:]), bits[1:], self.package(NL1Config(k=k, seed=SEED)),
                                "clients_uplink_bits", self.n, NOTES["nl1"])

    def dingo(self, out):
        """DINGO at its defaults, and the package's one round from each of the reference's iterates."""
        _, bits = self.methods.DINGO(self.oracle(self.n)).method(self.x0.copy(), max_iter=self.R - 1, tol=-np.inf,
                                                                  verbose=False)
        ref_x = [self.seen[1]] + self.seen[3:]  # seen: x_opt, x0, x_opt + 0.1 (its unused delta), x1, ...
        out["dingo"] = compare(ref_x, bits - 1, self.package(DINGOConfig(seed=SEED)), "clients_uplink_bits", self.n,
                               NOTES["dingo"])
        out["dingo"]["one_round_from_reference_iterates"] = [  # round k + 1: the package's step from x_k
            relative(after, self.package(DINGOConfig(seed=SEED), rounds=1, start=before)[0][1])
            for before, after in zip(ref_x, ref_x[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, help="a checkout of Rustem-Islamov/FedNL-Public")
    parser.add_argument("--commit", default=None, help="its commit, recorded as given where --reference is no "
                        "git work tree of its own (default: its HEAD; where it is one, --commit must be that HEAD)")
    parser.add_argument("--dataset", default="phishing")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rows", type=int, default=100, help="rows a client")
    parser.add_argument("--lam", type=float, default=1e-3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--topk", type=int, default=200, help="FedNL-CR's TopK k (entries of the packed triangle)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    modules = reference(args.reference)
    commit, commit_source = reference_commit(args.reference, git_line(args.reference, "rev-parse", "--show-toplevel"),
                                             git_line(args.reference, "rev-parse", "HEAD"), args.commit)
    data = Path(os.environ.get("DANE_DATA_DIR", ROOT.parent / "shared" / "data")) / "libsvm" / args.dataset
    if not data.is_file():
        raise SystemExit(f"error: {data} not found; set DANE_DATA_DIR to the folder holding libsvm/{args.dataset}")
    n, m = args.clients, args.rows
    d = max(int(t.split(":")[0]) for line in data.open() for t in line.split()[1:])
    A, b = modules[2].read_data(str(data), n * m, n, m, d, args.lam, labels=LABELS.get(args.dataset, ["+1", "-1"]))
    sides, out, started = Sides(modules, A, b, n, args.lam, args.rounds), {}, now()
    sides.diana_family(out)
    sides.fednl_cr(out, args.topk)
    sides.nl1(out, m)
    sides.dingo(out)
    result = {"reference": {"repository": "Rustem-Islamov/FedNL-Public", "commit": commit,
                            "commit_source": commit_source, "file": "methods.py"},
              "dataset": args.dataset, "clients": n, "rows_per_client": m, "dim": d, "lam": args.lam,
              "rounds": args.rounds, "topk": args.topk, "started_at": started, "load": load(), "machine": machine(),
              "command": "python -m scripts.peers.fednl_public " + " ".join(sys.argv[1:]), "methods": out}
    text = json.dumps(result, indent=1)
    Path(args.out).write_text(text + "\n") if args.out else print(text)


if __name__ == "__main__":
    main()
