"""Bad input, the whole probe list (issue 10): one line on stderr, ``error: ...``, naming the key or file
and the fix; exit status 2; nothing written into the run directory, nothing overwritten.

Each row of `CASES` is a command line (its files made first by `probe_files`) and a piece of
the line it must get; a row is added by appending a `case` to the list.  All rows run in the
session's one batch process (the ``commands`` fixture of tests/runs.py, with the other modules'
command rows), each through the entry point in-process as ``python -m`` runs it (`runpy`), with
its file descriptors captured, so that a row costs a config composition rather than a torch
import.  The rows named in `OWN_PROCESS` also run as their own ``python -m experiments.train``
(started by the session's fresh interpreter, `own_process`), one per way a process ends on bad
input: before Hydra (`cli`), in `run_spec`, inside a run; `test_horovodrun_*` runs a real launch.

A row's ``around`` names a context (below) that the batch enters around it: a process limit
(``ulimit -f``: a file system that fills up mid-run; ``ulimit -v``) or a run made first.  Rows
with ``permissions`` need file permissions to bind: the batch of a root user runs with
CAP_DAC_OVERRIDE dropped (`setpriv`), as root otherwise reads and writes any file.  Rows with
``kept`` fail mid-run: instead of "nothing written" they must keep every whole record and the
last committed checkpoint, as their line says.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse

from dane.data.files import save_npz
import runs
from helpers import REPO, composed, horovodrun, torchrun, train

SMALL = ("problem.n_samples=600", "problem.dim=20", "rounds=3", "quiet=true")
LOGREG = ("problem=logreg", "rounds=3", "quiet=true")
TORCHRUN_3 = {"RANK": "0", "WORLD_SIZE": "3"}  # what torchrun --nproc_per_node 3 sets, as rank 0 sees it


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    expected: str                      # a piece of the one stderr line; {tmp}: the folder of probe_files
    module: str = "experiments.train"
    env: dict = field(default_factory=dict)
    lines: int = 1                     # stderr lines: 0 on a rank other than 0, which leaves the line to rank 0
    out_dir: str = "{tmp}/runs/{name}"  # the run directory the command names (made by nobody, unless given)
    around: str = ""                   # a context of this module entered around the row in the batch
    permissions: bool = False          # needs file permissions to bind (a non-root user, or root without DAC override)
    kept: bool = False                 # fails mid-run: keeps its whole records and last checkpoint, as its line says
    horovod: bool = False              # the line of a horovodrun rank with Horovod installed (without, that is refused first)


def case(name: str, *args: str, expected: str, **kwargs) -> Case:
    return Case(name, args, expected, **kwargs)


CASES = [
    # keys and group choices: cli(), before Hydra
    case("key_typo", "algorithm.etta=1", *SMALL,
         expected="algorithm.etta is not a config key; did you mean algorithm.eta? (--cfg job prints every key)"),
    case("top_key_typo", "rounds_=3", *SMALL, expected="rounds_ is not a config key; did you mean rounds?"),
    case("group_typo_in_key", "algoritm.eta=1", *SMALL, expected="did you mean algorithm.eta?"),
    case("delete_missing_key", "~algorithm.etta", *SMALL, expected="algorithm.etta is not a config key"),
    case("added_key_the_config_does_not_take", "+algorithm.foo=1", *SMALL,
         expected="algorithm.foo is not a key of algorithm=dane; its keys: eta, mu, safeguard, name"),
    case("added_top_key_nothing_reads", "+roundz=3", *SMALL,
         expected="roundz is not a config key, and nothing reads a key that + adds; did you mean rounds?"),
    case("added_sim_key_nothing_reads", "++sim.alpah=1e-3", *SMALL,
         expected="sim.alpah is not a config key, and nothing reads a key that + adds; did you mean sim.alpha?"),
    case("added_group_the_defaults_have", "+experiment=speedup", *SMALL,
         expected="+experiment=speedup adds a group that the config's defaults already have; drop the +: "
                  "experiment=speedup"),
    case("added_key_of_a_nested_config", "problem=digits_mlp", "+problem.model.width=3", "rounds=1", "quiet=true",
         expected="problem.model.width is not a key of problem.model of problem=digits_mlp; its keys: name, hidden"),
    case("algorithm_relabelled", "algorithm.name=foo", *SMALL,
         expected="algorithm.name=foo would label another algorithm's run as foo (its summary, folder and table rows); "
                  "choose the algorithm with algorithm=<name>"),
    case("problem_relabelled", "+problem.name=ridge", *SMALL,
         expected="problem.name=ridge would label another problem's run as ridge"),
    case("group_without_a_choice", "algorithm=null", *SMALL,
         expected="algorithm=null leaves the group algorithm without a choice; choose one of: acc_sdane, adiana"),
    case("hydra_group_typo", "hydra/launcher=slurmm", *SMALL,
         expected="Could not find 'hydra/launcher/slurmm'; choose one of: basic, horovod, slurm, submitit_local"),
    case("plus_on_a_key_the_config_has", "+algorithm.mu=1", *SMALL,
         expected="Could not append to config. An item is already at 'algorithm.mu'. Either remove + prefix"),
    case("unknown_config_name", "--config-name", "nope", *SMALL,
         expected="Cannot find primary config 'nope'. Check that it's in your config search path."),
    case("override_hydra_cannot_read", "data.path=part-{{rank}}.csv", *SMALL,
         expected="data.path=part-{{rank}}.csv cannot be read as an override (mismatched input '{{' expecting <EOF>); "
                  "quote a value with special characters: \"data.path='part-{{rank}}.csv'\""),
    case("override_without_a_value", "rounds", *SMALL,
         expected="rounds cannot be read as an override (missing EQUAL at '<EOF>'); an override is key=value"),
    case("boolean_for_a_numbered_option", "algorithm=scaffold", "algorithm.option=true", *SMALL,
         expected="algorithm.option must be one of 1|2, got True"),
    case("fednl_boolean_option", "algorithm=fednl", "algorithm.option=true", *LOGREG,
         expected="algorithm.option must be 1 (projection onto H >= mu I) or 2 (H + l I), got True"),
    case("cg_tol_of_one", "algorithm=giant", "algorithm.cg_tol=1.5", *SMALL,
         expected="algorithm.cg_tol must be in (0, 1), got 1.5"),
    case("inexact_cg_tol_of_one", "algorithm=inexact_dane", "algorithm.local_solver=cg", "algorithm.cg_tol=1.5",
         *SMALL, expected="algorithm.cg_tol must be in [0, 1), got 1.5"),
    # local_tol >= 1 stopped every local solve at once (CG: 0 products, no progress, exit 0)
    case("local_tol_of_one", "problem.local_solver=cg", "problem.local_tol=5", *SMALL,
         expected="problem.local_tol must be in [0, 1), got 5"),
    case("federated_cg_fixed_count_without_a_cap", "algorithm=sdane", "algorithm.local_solver=cg",
         "problem.local_tol=0", *LOGREG, expected="algorithm.local_solver=cg with problem.local_tol=0 needs problem.local_max_iter"),
    # FedNL-BC under sampling: its own name and a fix that runs (it named algorithm=fednl variant=plain and offered
    # algorithm.variant=pp, which fednl_bc refuses)
    case("fednl_bc_sampled", "algorithm=fednl_bc", "workers=4", "algorithm.clients_per_round=2", *LOGREG,
         expected="algorithm=fednl_bc does not take algorithm.clients_per_round=2: FedNL-BC's round takes every "
                  "client; partial participation is FedNL-PP (use algorithm=fednl algorithm.variant=pp); set "
                  "algorithm.clients_per_round=null"),
    case("fednl_cr_without_rows", "algorithm=fednl", "algorithm.variant=cr", *SMALL,
         expected="algorithm=fednl needs a linear model with one output on rows (problem=logreg, or problem=ridge with "
                  "data=...), got problem=ridge_synthetic, which has no rows of a linear model"),
    case("sweep_into_one_out_dir", "-m", "algorithm=dane,gd", "overwrite=true", *SMALL, "hydra.sweep.dir={tmp}/sweep",
         expected="with -m puts every job of the sweep (algorithm=dane,gd) in one directory; drop out_dir"),
    # the sweep of an experiment file (hydra.sweeper.params): refused alike, before any job runs (n_samples is fixed)
    case("experiment_sweep_into_one_out_dir", "-m", "experiment=speedup", "overwrite=true", *SMALL,
         "hydra.sweep.dir={tmp}/sweep", module="experiments.simulate",
         expected="with -m puts every job of the sweep (hydra.sweeper.params: workers=1,2,4,8,16,64) in one directory; "
                  "drop out_dir"),
    case("negative_seed", "seed=-1", *SMALL, expected="seed must be an integer in [0, 2**32 - 1], got -1"),
    case("seed_beyond_the_generators", "problem.seed=99999999999999999999", *SMALL,
         expected="problem.seed must be an integer in [0, 2**32 - 1], got 99999999999999999999"),
    case("sweep_key_typo", "-m", "algorithm.etta=1,2", *SMALL, "hydra.sweep.dir={tmp}/sweep",
         expected="algorithm.etta is not a config key; did you mean algorithm.eta?"),
    case("sweep_key_missing_in_a_later_choice", "-m", "algorithm=dane,admm", "algorithm.eta=1", *SMALL,
         "hydra.sweep.dir={tmp}/sweep", expected="algorithm.eta is not a config key with algorithm=admm"),
    case("simulate_key_typo", "problem.dimm=3", "rounds=3", module="experiments.simulate",
         expected="problem.dimm is not a config key; did you mean problem.dim?"),
    case("own_config_dir_key_typo", "--config-dir", "{tmp}/my_conf", "problem=mine", "problem.n_sampless=600",
         expected="problem.n_sampless is not a config key; did you mean problem.n_samples?"),
    # a yaml of one's own whose _target_ module is not on the Python path (the dane console script does not put the
    # working folder on it): the module, the group, the yaml and the fix, without Hydra's logged lines
    case("own_target_module_not_on_the_path", "--config-dir", "{tmp}/my_conf", "algorithm=nowhere", *SMALL,
         expected="error: algorithm=nowhere ({tmp}/my_conf/algorithm/nowhere.yaml): algorithm._target_="
                  "dane_s68_nowhere.NowhereConfig names module dane_s68_nowhere, which is not on the Python path; put "
                  "the folder holding dane_s68_nowhere on PYTHONPATH, e.g. PYTHONPATH=. dane train ... from that folder"),
    case("unknown_algorithm", "algorithm=newton", *SMALL,
         expected="algorithm=newton is unknown; choose one of: acc_sdane, adiana, admm, aide, dane"),
    case("unknown_comm", "comm=mpi", *SMALL, expected="comm=mpi is unknown; choose one of: auto, horovod, local, ps, torch"),
    # values: run_spec(), before any process group
    case("seed_text", "seed=abc", *SMALL, expected="seed must be an integer in [0, 2**32 - 1], got 'abc'"),
    case("problem_seed_text", "problem.seed=abc", *SMALL, expected="problem.seed must be an integer in [0, 2**32 - 1], got 'abc'"),
    case("sim_seed_text", "sim.seed=abc", "workers=2", *SMALL, expected="sim.seed must be an integer in [0, 2**32 - 1], got 'abc'"),
    case("slowdown_scalar", "sim.slowdown=3", *SMALL,
         expected="sim.slowdown must be a list of per-worker compute factors like [1,1,3] (recycled over the workers), got 3"),
    case("eta_inf", "algorithm.eta=inf", *SMALL, expected="algorithm.eta must be a finite number, got inf"),
    case("eta_nan", "algorithm.eta=nan", *SMALL, expected="algorithm.eta must be a finite number, got nan"),
    case("mu_negative", "algorithm.mu=-1", *SMALL, expected="algorithm.mu must be >= 0, got -1"),
    case("eta_zero", "algorithm.eta=0", *SMALL, expected="algorithm.eta must be > 0, got 0"),
    case("eta_negative", "algorithm.eta=-2.5", *SMALL, expected="algorithm.eta must be > 0, got -2.5"),
    case("fewer_rows_than_workers", *SMALL, "problem.n_samples=3", "workers=4",
         expected="problem.n_samples=3 is fewer than workers=4"),
    case("unknown_problem", "problem=imagenet", *SMALL, expected="problem=imagenet is unknown; choose one of:"),
    case("rounds_negative", *SMALL, "rounds=-1", expected="rounds must be an integer >= 0 (0: only evaluate w_0), got -1"),
    # issue 45, item 5: FedNL's alpha beyond the paper's bound (it stalled at 2.5x O*); a data key named as typed
    case("fednl_alpha_above_one", "algorithm=fednl", "algorithm.alpha=3", *LOGREG,
         expected="algorithm.alpha must be in (0, 1], got 3: FedNL's theory (Safaryan et al. 2022) takes alpha <= "
                  "1/(omega + 1) for an unbiased compressor, 1 - sqrt(1 - delta) or 1 for a contractive one"),
    case("fednl_alpha_above_the_unbiased_bound", "algorithm=fednl", "algorithm.compressor=randk:5", "algorithm.alpha=0.5",
         "workers=2", *LOGREG, expected="algorithm.alpha must be <= 1/(omega + 1) = 0.01008 for the unbiased compressor "
                                        "randk:5 on d = 31"),
    case("data_key_named_as_typed", *LOGREG, "data.sharding=dirichlet", "data.alpha=-1", "workers=2",
         expected="error: data.alpha must be > 0, got -1"),
    case("network_data_key_named_as_typed", "problem=digits_mlp", "problem.data.sharding=quantity",
         "problem.data.exponent=-1", "rounds=1", "quiet=true", expected="error: problem.data.exponent must be >= 0"),
    # a minibatch larger than a worker's shard (digits_mlp: 1437 training rows, 479 on each of 3 workers) is refused,
    # not drawn as the whole shard; the inner solve's at its first use (sync_sgd leaves it unused: runs with 500)
    *[case(f"batch_over_the_shard_{name}", "problem=digits_mlp", "workers=3", "rounds=1", "quiet=true", *args,
           expected=f"error: {key}=500 exceeds this worker's 479 samples; use {fix}")
      for name, key, fix, args in [
          ("sync_sgd", "algorithm.batch_size", "a batch no larger than the smallest shard",
           ("algorithm=sync_sgd", "algorithm.batch_size=500")),
          ("local_sgd", "algorithm.batch_size", "a smaller batch or null for the full shard",
           ("algorithm=local_sgd", "algorithm.lr=0.05", "algorithm.batch_size=500")),
          ("dane", "problem.inner_batch_size", "a smaller batch or null for the full shard",
           ("problem.inner_batch_size=500",)),
          ("dane_stacked", "problem.inner_batch_size", "a smaller batch or null for the full shard",
           ("problem.inner_batch_size=500", "sim.batched=true")),
          ("grad_batches", "problem.inner_batch_size", "a smaller batch or null for the full shard",
           ("algorithm=gd", "algorithm.lr=0.05", "problem.grad_batches=2", "problem.inner_batch_size=500"))]],
    case("covariance_choice", "problem.covariance=wishart", *SMALL,
         expected="problem.covariance must be one of iso|decay, got 'wishart'"),
    # booleans take only true/false: Python would read any of these strings as true
    case("safeguard_no", "algorithm.safeguard=no", *SMALL, expected="algorithm.safeguard must be true or false, got 'no'"),
    case("safeguard_quoted", "algorithm.safeguard='false'", *SMALL,
         expected="algorithm.safeguard must be true or false, got 'false'"),
    case("save_iterate_one", "save_iterate=1", *SMALL, expected="save_iterate must be true or false, got 1"),
    case("pin_cores_no", "comm.pin_cores=no", *SMALL, expected="comm.pin_cores must be true or false, got 'no'"),
    case("cycle_time_text", "comm.horovod_cycle_time_ms=fast", *SMALL,
         expected="comm.horovod_cycle_time_ms must be a number of milliseconds > 0 or auto, got 'fast'"),
    case("cycle_time_zero", "comm.horovod_cycle_time_ms=0", *SMALL,
         expected="comm.horovod_cycle_time_ms must be > 0, got 0"),
    case("csv_missing", "problem=ridge", "data=csv", "data.path=/nonexistent/x.csv", "data.target=y", "quiet=true",
         expected="x.csv"),
    # issue 47, item 3: data=mongo (the stores are made by probe_files)
    case("mongo_bad_uri", *LOGREG, "data=mongo", "data.uri=mongodb://host:notaport/db", "data.collection=t",
         expected="data.uri=mongodb://host:notaport/db is not a MongoDB URI"),
    case("mongo_no_store", *LOGREG, "data=mongo", "data.uri={tmp}/no_store", "data.collection=t",
         expected="data.uri={tmp}/no_store: no store there"),
    case("mongo_missing_collection", *LOGREG, "data=mongo", "data.uri={tmp}/store", "data.collection=u",
         expected="data.collection=u: no such data set in {tmp}/store (it holds: short, t)"),
    case("mongo_short_store", *LOGREG, "data=mongo", "data.uri={tmp}/store", "data.collection=short",
         expected="is short: 8 of 9 samples (uploading); push it again to complete it"),
    case("mongo_too_many_documents", *LOGREG, "data=mongo", "data.uri={tmp}/extra_store", "data.collection=t",
         expected="holds 10 documents for 9 samples (complete); push it again to repair it"),
    case("mongo_unreadable_store", *LOGREG, "data=mongo", "data.uri={tmp}/cut_store", "data.collection=t",
         expected="cut_store cannot be read (AssertionError); push it again: dane data push FILE --uri {tmp}/cut_store "
                  "--collection t"),
    case("mongo_column_sharding_without_clients", *LOGREG, "data=mongo", "data.uri={tmp}/store", "data.collection=t",
         "data.sharding=column", "data.client_column=site", "workers=2",
         expected="error: data.client_column=site: data set t in {tmp}/store was pushed without a client column; push "
                  "it with them: dane data push FILE --client-column site --uri {tmp}/store --collection t --replace"),
    case("digits_with_logreg", "problem=logreg", "data=digits", "quiet=true", expected="problem=logreg needs two classes"),
    case("local_solver_choice", "problem=ridge", "problem.local_solver=qr", "quiet=true",
         expected="problem.local_solver must be one of"),
    case("safeguard_off", "algorithm.safeguard=off", *SMALL, expected="algorithm.safeguard must be true or false, got 'off'"),
    case("quiet_no", *SMALL, "quiet=no", expected="quiet must be true or false, got 'no'"),
    case("torch_backend_mpi", "comm.torch_backend=mpi", *SMALL,
         expected="comm.torch_backend must be gloo, or null (gloo), got 'mpi'"),
    case("torch_backend_nccl", "comm.torch_backend=nccl", *SMALL,
         expected="comm.torch_backend=nccl cannot reduce the vectors DANE communicates: they live in host memory, "
                  "also for a network on CUDA; drop comm.torch_backend (gloo)"),
    case("calibration_not_json", "sim.calibration={tmp}/not_json.json", *SMALL,
         expected="sim.calibration: {tmp}/not_json.json is not a calibration file (not JSON: Expecting value at line 1 "
                  "column 1); re-run `dane calibrate` to remake it, or set sim.calibration=null"),
    case("calibration_binary", "sim.calibration={tmp}/binary.json", *SMALL,
         expected="{tmp}/binary.json is not a calibration file (not text)"),
    case("calibration_no_beta", "sim.calibration={tmp}/no_beta.json", *SMALL,
         expected="{tmp}/no_beta.json is not a calibration file (no 'beta' entry)"),
    case("calibration_bad_tail", "sim.calibration={tmp}/bad_tail.json", *SMALL,
         expected="sim.calibration: {tmp}/bad_tail.json is not a tail calibration (excess_s must not decrease (a "
                  "quantile function)); re-run `dane calibrate --tail` to remake it, or drop its tail entry"),
    case("calibration_missing", "sim.calibration={tmp}/no_such_calibration.json", *SMALL,
         expected="sim.calibration={tmp}/no_such_calibration.json: no such file; make it with `dane calibrate --out "
                  "{tmp}/no_such_calibration.json`, or set sim.calibration=null for the package's defaults"),
    case("ps_calibration_missing", "sim.topology=ps", "sim.ps_calibration={tmp}/no_such_calibration.json", *SMALL,
         expected="sim.ps_calibration={tmp}/no_such_calibration.json: no such file; make it with `dane calibrate "
                  "--topology ps --out {tmp}/no_such_calibration.json`"),
    case("calibration_of_ps_as_ring", "sim.calibration={tmp}/ps_calibration.json", *SMALL,
         expected="sim.calibration: {tmp}/ps_calibration.json is a calibration of topology ps, not allreduce: give it "
                  "as sim.ps_calibration with sim.topology=ps"),
    case("calibration_of_ring_as_ps", "sim.topology=ps", "sim.ps_calibration={tmp}/no_tail.json", *SMALL,
         expected="sim.ps_calibration: {tmp}/no_tail.json is a calibration of topology allreduce, not ps: give it as "
                  "sim.calibration,"),
    case("calibration_negative_alpha", "sim.calibration={tmp}/negative_alpha.json", *SMALL,
         expected="sim.calibration: {tmp}/negative_alpha.json is not a calibration file (comm cost alpha must be >= 0 "
                  "seconds, got -1.0)"),
    case("calibration_machine_not_an_object", "sim.calibration={tmp}/machine_vm.json", *SMALL,
         expected="sim.calibration: {tmp}/machine_vm.json is not a calibration file (its machine is 'vm', not an object "
                  "with a host); re-run `dane calibrate` to remake it"),
    case("calibration_infinite_beta", "sim.calibration={tmp}/infinite_beta.json", *SMALL,
         expected="sim.calibration: {tmp}/infinite_beta.json is not a calibration file (its beta is inf, not a finite "
                  "number); re-run `dane calibrate` to remake it"),
    case("calibration_of_an_unknown_topology", "sim.calibration={tmp}/odd_topology.json", *SMALL,
         expected="{tmp}/odd_topology.json is not a calibration file (topology 'tree' is neither allreduce nor ps)"),
    case("memory_cholesky", *SMALL, "problem.dim=100000", "problem.local_solver=cholesky",
         "problem.factorization=cholesky", "workers=8",
         expected="problem.dim=100000 with problem.n_samples=600 and 8 workers needs about 1280.5 GB of memory"),
    case("workers_mismatch_rank0", "workers=3", *SMALL, env={"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, horovod=True,
         expected="workers=3 but the launcher started 2 process(es); drop workers= under horovodrun/torchrun"),
    case("workers_mismatch_rank1", "workers=3", *SMALL, env={"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"},
         expected="", lines=0),
    # comm=ps (a parameter server): servers, staleness, the launcher
    case("torch_without_launcher", "comm=torch", *SMALL,
         expected="comm=torch needs a launcher that sets RANK and WORLD_SIZE: torchrun --nproc_per_node <n> (or srun "
                  "under Slurm); use workers=<m> for the in-process simulator"),
    case("ps_without_launcher", "comm=ps", *SMALL,
         expected="comm=ps needs torchrun (its servers are processes of their own: torchrun --nproc_per_node "
                  "<workers + comm.servers> -m experiments.train comm=ps ...), not without a launcher; use workers=<m>"),
    case("ps_under_horovodrun", "comm=ps", *SMALL, env={"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
         expected="comm=ps needs torchrun (its servers are processes of their own"),
    case("ps_servers_zero", "comm=ps", "comm.servers=0", *SMALL, env=TORCHRUN_3,
         expected="comm.servers must be an integer >= 1 (the parameter-server ranks), got 0"),
    case("ps_servers_all_processes", "comm=ps", "comm.servers=3", *SMALL, env=TORCHRUN_3,
         expected="comm.servers=3 but torchrun started 3 process(es); at least one must be a worker: launch 4 or more, "
                  "or lower comm.servers"),
    case("ps_workers_mismatch", "comm=ps", "workers=3", *SMALL, env=TORCHRUN_3,
         expected="workers=3 but torchrun started 3 process(es), 1 of them server(s) (comm.servers=1): 2 worker(s); "
                  "drop workers= or launch 4 processes"),
    case("ps_workers_mismatch_server_rank", "comm=ps", "workers=3", *SMALL, env={**TORCHRUN_3, "RANK": "2"},
         expected="", lines=0),
    case("ps_slowdown_below_one", "comm=ps", "comm.staleness=inf", "comm.slowdown=[1,0.5]", "algorithm=sync_sgd", *SMALL,
         env=TORCHRUN_3, expected="comm.slowdown factors must be >= 1 (a worker can be slowed, not sped up), got [1, 0.5]"),
    case("ps_slowdown_synchronous", "comm=ps", "comm.slowdown=[1,3]", *SMALL, env=TORCHRUN_3,
         expected="comm.slowdown slows the workers of a real asynchronous run (comm.staleness > 0); for a synchronous "
                  "run simulate stragglers with workers=<m> sim.slowdown=[...]"),
    case("ps_staleness_two_servers", "comm=ps", "comm.servers=2", "comm.staleness=2", "algorithm=sync_sgd", *SMALL,
         env=TORCHRUN_3, expected="comm.staleness=2 under comm=ps runs with one server for now, got comm.servers=2; "
                                  "set comm.servers=1"),
    case("ps_staleness_dane", "comm=ps", "comm.staleness=1", *SMALL,
         expected="comm.staleness=1 with algorithm=dane: DANE's local solve needs the global gradient of the same "
                  "iterate; set comm.staleness=0"),
    case("ps_staleness_negative", "comm=ps", "comm.staleness=-1", "algorithm=gd", *SMALL,
         expected="comm.staleness must be an integer >= 0 or inf (fully asynchronous), got -1"),
    # comm.staleness > 0: sync_sgd and local_sgd only, through a parameter server (dane.loop.asynchronous)
    case("staleness_text", "comm.staleness=fast", "workers=2", *SMALL,
         expected="comm.staleness must be an integer >= 0 or inf (fully asynchronous), got 'fast'"),
    case("staleness_dane_simulated", "comm.staleness=inf", "workers=2", "sim.topology=ps", *SMALL,
         expected="comm.staleness=inf with algorithm=dane: DANE's local solve needs the global gradient of the same "
                  "iterate; set comm.staleness=0 (only local_sgd and sync_sgd run asynchronously)"),
    case("staleness_inexact_dane", "algorithm=inexact_dane", "comm.staleness=1", "workers=2", *SMALL,
         expected="comm.staleness=1 with algorithm=inexact_dane: DANE's local solve needs the global gradient"),
    case("fednl_on_a_network", "algorithm=fednl", "problem=digits_mlp", "rounds=1", "quiet=true",
         expected="algorithm=fednl needs a linear model with one output on rows (problem=logreg, or problem=ridge with "
                  "data=...), got problem=digits_mlp, which has no rows of a linear model"),
    case("newton_3pc_on_ridge_synthetic", "algorithm=newton_3pc", *SMALL,
         expected="algorithm=newton_3pc needs a linear model with one output on rows (problem=logreg, or problem=ridge "
                  "with data=...), got problem=ridge_synthetic, which has no rows of a linear model"),
    case("nl1_softmax", "algorithm=nl1", "problem=softmax", "workers=2", "rounds=1",
         expected="algorithm=nl1 needs a linear model with one output on rows (problem=logreg, or problem=ridge with "
                  "data=...), got a softmax model (problem.loss=softmax)"),
    case("staleness_giant", "algorithm=giant", "comm.staleness=1", "workers=2", *SMALL,
         expected="comm.staleness=1 with algorithm=giant: GIANT averages Newton directions and line-searches at the "
                  "same iterate; set comm.staleness=0"),
    case("staleness_disco", "algorithm=disco", "comm.staleness=1", "workers=2", *SMALL,
         expected="comm.staleness=1 with algorithm=disco: DiSCO's distributed CG needs Hessian-vector products"),
    case("staleness_admm", "algorithm=admm", "comm.staleness=4", "workers=2", *SMALL,
         expected="comm.staleness=4 with algorithm=admm: ADMM's consensus step needs every worker's x_i + u_i of the "
                  "same round; set comm.staleness=0"),
    case("staleness_gd", "algorithm=gd", "comm.staleness=2", "workers=2", *SMALL,
         expected="comm.staleness=2 with algorithm=gd: distributed GD averages exact gradients of the same iterate "
                  "(its asynchronous form is algorithm=sync_sgd); set comm.staleness=0"),
    case("staleness_under_torchrun", "algorithm=sync_sgd", "comm.staleness=inf", *SMALL, env=TORCHRUN_3,
         expected="comm.staleness=inf runs through a parameter server, not under comm=torch: under torchrun with "
                  "comm=ps, or in the simulator (plain python, workers=<m> sim.topology=ps)"),
    case("staleness_without_ps_topology", "algorithm=sync_sgd", "comm.staleness=1", "workers=2", *SMALL,
         expected="comm.staleness=1 simulates workers pushing to a parameter server; add sim.topology=ps"),
    case("staleness_best_election", "algorithm=local_sgd", "algorithm.aggregate=best", "comm.staleness=1",
         "workers=2", "sim.topology=ps", *SMALL,
         expected="comm.staleness=1 with algorithm.aggregate=best: the election needs all m models of one round; "
                  "use algorithm.aggregate=mean or weighted"),
    case("staleness_checkpoint", "algorithm=sync_sgd", "comm.staleness=1", "workers=2", "sim.topology=ps",
         "checkpoint_every=2", *SMALL,
         expected="comm.staleness=1: the asynchronous simulator does not checkpoint, resume or lose workers yet; "
                  "drop checkpoint_every, resume and sim.fail_at"),
    case("staleness_checkpoint_ps", "algorithm=sync_sgd", "comm=ps", "comm.staleness=inf", "checkpoint_every=2",
         *SMALL, env=TORCHRUN_3,
         expected="comm.staleness=inf: an asynchronous run under comm=ps does not checkpoint or resume yet; drop "
                  "checkpoint_every and resume"),
    case("staleness_fail_at_ps", "algorithm=sync_sgd", "comm=ps", "comm.staleness=inf", "sim.fail_at=[[1,1]]",
         *SMALL, env=TORCHRUN_3,
         expected="sim.fail_at loses a simulated worker; it needs workers > 1 under plain python (under a launcher, "
                  "kill a process instead)"),
    case("step_time_zero", "algorithm=sync_sgd", "comm.staleness=1", "workers=2", "sim.topology=ps",
         "sim.step_time=0", *SMALL, expected="sim.step_time must be > 0, got 0"),
    case("ps_nccl", "comm=ps", "comm.torch_backend=nccl", *SMALL, env=TORCHRUN_3,
         expected="comm=ps runs on gloo point-to-point messages, got comm.torch_backend=nccl; drop comm.torch_backend"),
    # inside the run: data files, the run directory, the records
    case("monitor_typo", "early_stop.monitor=test_acc", "early_stop.patience=2", "workers=2", *SMALL,
         expected="early_stop.monitor=test_acc is not a key of this run's records; set it to one of: "),
    case("rerun_finished_out_dir", *SMALL, out_dir="{tmp}/finished",
         expected="out_dir={tmp}/finished already holds a run (rounds.jsonl, summary.json); choose a new out_dir"),
    # one launched process (comm=local): rank 0 finds it before any collective and sends it to every rank
    case("rerun_finished_out_dir_launched", "comm=local", *SMALL, out_dir="{tmp}/finished",
         expected="out_dir={tmp}/finished already holds a run (rounds.jsonl, summary.json); choose a new out_dir"),
    case("out_dir_is_a_file", *SMALL, out_dir="{tmp}/a_file",
         expected="out_dir={tmp}/a_file is a file, not a directory; choose another out_dir"),
    case("out_dir_under_a_file", *SMALL, out_dir="{tmp}/a_file/sub",
         expected="out_dir={tmp}/a_file/sub cannot be made: {tmp}/a_file is a file, not a directory; choose another "
                  "out_dir"),
    case("libsvm_nan", *LOGREG, "data=libsvm", "data.path={tmp}/nan.svm",
         expected="{tmp}/nan.svm holds 1 non-finite values (nan/inf), the first at line 3, feature 2; clean the file"),
    case("libsvm_inf_label", *LOGREG, "data=libsvm", "data.path={tmp}/inf_label.svm",
         expected="{tmp}/inf_label.svm holds 1 non-finite values (nan/inf), the first at line 2, the label"),
    case("libsvm_garbled_gzip", *LOGREG, "data=libsvm", "data.path={tmp}/garbled.svm.gz",
         expected="{tmp}/garbled.svm.gz cannot be read (Error -3 while decompressing data"),
    case("npz_nan", *LOGREG, "data=npz", "data.path={tmp}/nan.npz",
         expected="{tmp}/nan.npz: 'X' holds 1 non-finite values (first at row 1, column 0); clean the data"),
    case("npz_sparse_inf", *LOGREG, "data=npz", "data.path={tmp}/sparse_inf.npz",
         expected="{tmp}/sparse_inf.npz: 'X' holds 1 non-finite values (first at row 2, column 1)"),
    case("csv_inf_impute_error", *LOGREG, "data=csv", "data.path={tmp}/inf.csv", "data.target=y", "data.impute=error",
         expected="{tmp}/inf.csv line 3, column 'a': 'inf' is not a finite number and data.impute=error; clean the file"),
    case("csv_nan_impute_error", *LOGREG, "data=csv", "data.path={tmp}/nan.csv", "data.target=y", "data.impute=error",
         expected="{tmp}/nan.csv line 3, column 'a': value missing ('NaN') and data.impute=error; fill it in, "
                  "or set data.impute=mean"),
    case("csv_inf_label", *LOGREG, "data=csv", "data.path={tmp}/inf_label.csv", "data.target=y",
         expected="{tmp}/inf_label.csv line 4: the label (column 'y') is not a finite number ('inf')"),
    case("csv_binary", *LOGREG, "data=csv", "data.path={tmp}/binary.csv", "data.target=y",
         expected="{tmp}/binary.csv is not UTF-8 text"),
    case("mnist_garbled_gzip", "problem=mnist_lenet5", "data_dir={tmp}/mnist", "rounds=1", "quiet=true",
         expected="{tmp}/mnist/t10k-images-idx3-ubyte.gz is not a readable IDX file"),
    case("aide_tau_text", "algorithm=aide", "algorithm.tau=fast", *SMALL,
         expected="algorithm.tau must be a number >= 0 or auto, got 'fast'"),
    case("svrg_variant_algorithm", "algorithm=inexact_dane", "algorithm.svrg_variant=jakub", *SMALL,
         expected="algorithm.svrg_variant must be one of epochs|matlab, got 'jakub'"),
    case("svrg_variant_problem", "problem.svrg_variant=jakub", *SMALL,
         expected="problem.svrg_variant must be one of epochs|matlab, got 'jakub'"),
    # issue 26: the last bad inputs
    case("data_unreadable", *LOGREG, "data=libsvm", "data.path={tmp}/unreadable.svm", permissions=True,
         expected="data file {tmp}/unreadable.svm cannot be read (Permission denied); give read permission "
                  "(chmod a+r {tmp}/unreadable.svm) or copy it somewhere readable"),
    case("npy_named_npz", *LOGREG, "data=npz", "data.path={tmp}/array.npz",
         expected="{tmp}/array.npz is a .npy file (one array, from np.save), not an .npz archive of X and y; "
                  "write it with dane.data.files.save_npz(path, X, y)"),
    case("npz_header_beyond_its_bytes", *LOGREG, "data=npz", "data.path={tmp}/huge_header.npz",
         expected="{tmp}/huge_header.npz: 'X' declares 1000000 x 100000 float64 (800.0 GB) but the archive holds "),
    case("npz_sparse_shape_1e10", *LOGREG, "data=npz", "data.path={tmp}/sparse_1e10.npz",
         expected="data {tmp}/sparse_1e10.npz with d=10000000001 features needs about 1360.0 GB of memory (2 rows "),
    case("libsvm_index_2e9", *LOGREG, "data=libsvm", "data.path={tmp}/index_2e9.svm",
         expected="data {tmp}/index_2e9.svm with d=2000000001 features needs about 272.0 GB of memory"),
    case("libsvm_n_features_under_ulimit_v", *LOGREG, "data=libsvm", "data.path={tmp}/small.svm",
         "data.n_features=1000000000", around="address_space_limit",
         expected="data {tmp}/small.svm with d=1000000001 features needs about 136.0 GB of memory (12 rows and "
                  "their transpose 8.0 GB, 16 vectors of d 128.0 GB) but the process limit (ulimit -v) leaves "),
    case("cholesky_under_ulimit_v", *SMALL, "problem.dim=30000", "problem.local_solver=cholesky",
         "problem.factorization=cholesky", around="address_space_limit",
         expected="problem.dim=30000 with problem.n_samples=600 needs about 14.5 GB of memory (the 600 x 30000 data "
                  "0.1 GB, 1 local 30000 x 30000 Hessian(s) with a factor each 14.4 GB) but the process limit "
                  "(ulimit -v) leaves "),
    case("csv_with_the_default_problem", "data=csv", "rounds=3", "quiet=true",
         expected="data= is not used by problem=ridge_synthetic; add problem=ridge|logreg|softmax (the convex "
                  "problems, which read data=csv|libsvm|npz|<built-in>)"),
    case("standardize_target_logreg", *LOGREG, "problem.standardize_target=true",
         expected="problem.standardize_target is not a config key; it is a key of problem=ridge, not of "
                  "problem=logreg: drop it, or choose problem=ridge"),
    case("csv_without_path", "problem=logreg", "data=csv", "rounds=3", "quiet=true",
         expected="data.path and data.target have no default with data=csv; add data.path=... data.target=..."),
    case("hidden_text", "problem=digits_mlp", "model@problem.model=mlp", "problem.model.hidden=[abc]", "rounds=1",
         "quiet=true", expected="problem.model.hidden must be a list of layer widths (positive integers) like [100] "
                                "or [256,128], or [] for none, got ['abc']"),
    case("admissions_inf", "problem=logreg", "data=builtin", "data.dataset=admissions", "data_dir={tmp}/admissions",
         "rounds=3", "quiet=true", expected="{tmp}/admissions/admissions.csv line 3, column 'gre': 'inf' is not a "
                                            "finite number; fix or remove the row"),
    case("out_dir_under_proc", *SMALL, out_dir="/proc/self/dane_probe/run",
         expected="out_dir=/proc/self/dane_probe/run cannot be created (no such file or directory); "
                  "choose another out_dir"),
    case("out_dir_read_only", *SMALL, out_dir="{tmp}/read_only/run", permissions=True,
         expected="out_dir={tmp}/read_only/run cannot be created (permission denied); choose another out_dir"),
    case("out_dir_fills_up", *SMALL, "rounds=80", "checkpoint_every=4", "tol=null", out_dir="{tmp}/fills_up",
         around="file_size_limit", kept=True,
         expected="out_dir={tmp}/fills_up cannot be written (File too large: rounds.jsonl); kept: rounds 0-"),
    case("out_dir_checkpoint_read_only", *SMALL, "rounds=6", "checkpoint_every=2", out_dir="{tmp}/checkpoint_read_only",
         permissions=True, kept=True,
         expected="out_dir={tmp}/checkpoint_read_only cannot be written (Permission denied: checkpoint/round2); kept: "
                  "rounds 0-1 in rounds.jsonl (no checkpoint yet); free space or make it writable, then run again "
                  "with overwrite=true"),
    case("resume_true", *SMALL, "resume=true", expected="resume takes auto (continue out_dir from its newest "
         "checkpoint, or start there) or a run directory, got true; use resume=auto"),
    case("resume_nul_filled_log", *SMALL, "rounds=9", "checkpoint_every=3", "resume=auto", out_dir="{tmp}/nul_log",
         around="nul_filled_log", expected="{tmp}/nul_log/rounds.jsonl line 1 is not a round record ("),
    # issue 35: the last inputs that end badly
    case("simulator_thread_limit", *SMALL, "workers=4", around="thread_limit",
         expected="workers=4: the simulator started 2 worker threads, then no more (can't start new thread): each "
                  "reserves 4 MiB of stack, 16 MiB of address space in all, beyond the process's limit on address "
                  "space or threads (ulimit -u); use fewer workers, or raise ulimit -v"),
    case("admissions_not_utf8", "problem=admissions_logreg", "data_dir={tmp}/admissions_binary", "rounds=1",
         "quiet=true", expected="{tmp}/admissions_binary/admissions.csv is not UTF-8 text (byte 0x80 cannot be "
                                "decoded); is it the admissions CSV? save it as UTF-8 CSV"),
    case("admissions_one_class", "problem=admissions_logreg", "data_dir={tmp}/admissions_one_class", "rounds=1",
         "quiet=true", expected="{tmp}/admissions_one_class/admissions.csv: every row has admit=1; the "
                                "admissions data needs rows of both classes (0 and 1): is it the whole file?"),
    case("builtin_admissions_one_class", "problem=logreg", "data=builtin", "data.dataset=admissions",
         "data_dir={tmp}/admissions_one_class", "rounds=1", "quiet=true",
         expected="{tmp}/admissions_one_class/admissions.csv: every row has admit=1"),
    case("csv_logreg_one_class", *LOGREG, "data=csv", "data.path={tmp}/ones.csv", "data.target=y",
         expected="csv:ones.csv: problem=logreg needs two classes, but every label is 1; check the labels it reads "
                  "(data.target of a CSV, data.y_key of an .npz), or add rows of the other class"),
    case("libsvm_logreg_one_class", *LOGREG, "data=libsvm", "data.path={tmp}/zeros.svm",
         expected="libsvm:zeros.svm: problem=logreg needs two classes, but every label is 0; check the labels"),
    case("npz_logreg_one_class", *LOGREG, "data=npz", "data.path={tmp}/minus_ones.npz",
         expected="npz:minus_ones.npz: problem=logreg needs two classes, but every label is -1"),
    case("split_two_servers_rank1", "algorithm=split", "problem=digits_mlp", "comm=ps", "comm.servers=2", "rounds=1",
         "quiet=true", env={**TORCHRUN_3, "RANK": "1"}, expected="", lines=0),  # rank 0 says it (test_split_backend)
    case("text_named_npz", *LOGREG, "data=npz", "data.path={tmp}/text.npz",
         expected="{tmp}/text.npz is not an .npz archive: it is a text file (for a CSV use data=csv, for LIBSVM "
                  "data=libsvm); write it with dane.data.files.save_npz(path, X, y)"),
    # issue 47: clients from a column (data.sharding=column)
    case("csv_clients_other_than_workers", *LOGREG, "data=csv", "data.path={tmp}/clients.csv", "data.target=y",
         "data.sharding=column", "data.client_column=site", "workers=2",
         expected="error: data.client_column=site has 3 distinct values (clients), one per worker, but workers=2; "
                  "set workers=3 (under horovodrun or torchrun: launch 3 processes)"),
    case("npz_clients_other_than_workers", *LOGREG, "data=npz", "data.path={tmp}/clients.npz",
         "data.sharding=column", "data.client_column=groups", "workers=4",
         expected="error: data.client_column=groups has 3 distinct values (clients), one per worker, but workers=4"),
    case("libsvm_qids_other_than_workers", *LOGREG, "data=libsvm", "data.path={tmp}/qid.svm",
         "data.sharding=column", "data.client_column=qid",
         expected="error: data.client_column=qid has 2 distinct values (clients), one per worker, but workers=1"),
    case("libsvm_line_without_qid", *LOGREG, "data=libsvm", "data.path={tmp}/small.svm", "data.sharding=column",
         "data.client_column=qid", "workers=2",
         expected="{tmp}/small.svm line 1 has no qid: field (12 of its 12 rows lack one); with data.client_column=qid "
                  "every line is '<label> qid:<n> <index>:<value> ...'"),
    case("libsvm_client_column_not_qid", *LOGREG, "data=libsvm", "data.path={tmp}/qid.svm", "data.sharding=column",
         "data.client_column=user", expected="data.client_column=user: a LIBSVM line's only client field is qid:<n>; "
                                             "set data.client_column=qid"),
    case("csv_client_column_absent", *LOGREG, "data=csv", "data.path={tmp}/clients.csv", "data.target=y",
         "data.sharding=column", "data.client_column=country", "workers=3",
         expected="{tmp}/clients.csv has no column 'country'; its columns are: y, a, site; set data.client_column to "
                  "one of them"),
    case("csv_client_missing", *LOGREG, "data=csv", "data.path={tmp}/client_missing.csv", "data.target=y",
         "data.sharding=column", "data.client_column=site", "workers=3",
         expected="{tmp}/client_missing.csv line 3, column 'site' (data.client_column): value missing ('?'); every "
                  "row needs a client: fill it in (e.g. 'unknown') or remove the row"),
    case("client_column_without_column_sharding", *LOGREG, "data=csv", "data.path={tmp}/clients.csv",
         "data.target=y", "data.client_column=site", "workers=3",
         expected="error: data.client_column=site names the clients of data.sharding=column; set "
                  "data.sharding=column, or drop data.client_column"),
    case("column_sharding_without_client_column", *LOGREG, "data=npz", "data.path={tmp}/clients.npz",
         "data.sharding=column", "workers=3", expected="error: data.sharding=column needs data.client_column=NAME, "
                                                       "a key of the archive holding one value per row"),
    case("column_sharding_of_a_builtin_set", *LOGREG, "data=breast_cancer", "data.sharding=column", "workers=3",
         expected="error: data.sharding=column reads each row's client from a column of a data file, which this "
                  "data set has not; use data=csv|npz|libsvm|mongo with data.client_column=NAME"),
    # a count K above the message it compresses ran dense while the records named the spec: refused as the method
    # is built (d = 20 here), or at the first message
    case("compressor_count_above_d", "algorithm=ef21", "algorithm.compressor=randk:1000", *SMALL,
         expected="error: algorithm.compressor=randk:1000 keeps K = 1000 entries of a message of 20; choose K <= 20 "
                  "(randk:20 keeps them all), or a fraction of each message (randk:0.1)"),
    case("comm_compress_count_above_d", "algorithm=gd", "comm.compress=topk:21", *SMALL,
         expected="error: comm.compress=topk:21 keeps K = 21 entries of a message of 20; choose K <= 20 "
                  "(topk:20 keeps them all), or a fraction of each message (topk:0.1)"),
    # a rank R above the side d of FedNL's Hessian differences ran as rank d under the spec's name (d = 31 here)
    case("fednl_rank_above_d", "algorithm=fednl", "algorithm.compressor=rank:32", *LOGREG,
         expected="error: algorithm.compressor=rank:32 keeps rank R = 32 of a 31×31 matrix; choose R <= 31 "
                  "(rank:31 sends the whole matrix)"),
    # an interpolation that does not resolve: OmegaConf's traceback from wherever the value was first read, exit 1
    # ({{ }}: a brace of the command line, the rows being format strings)
    case("interpolation_of_an_unset_variable", *LOGREG, "data=libsvm",
         "data.path=${{oc.env:DANE_TEST_UNSET_VARIABLE}}/phishing",
         expected="error: data.path: Environment variable 'DANE_TEST_UNSET_VARIABLE' not found (in "
                  "${{oc.env:DANE_TEST_UNSET_VARIABLE}}/phishing); set DANE_TEST_UNSET_VARIABLE in the environment, "
                  "or give data.path its value"),
    case("interpolation_of_a_missing_key", "algorithm.mu=${{nonexistent}}", *SMALL,
         expected="error: algorithm.mu: Interpolation key 'nonexistent' not found (in ${{nonexistent}}); a ${{key}} "
                  "names a key of the config (--cfg job prints every key)"),
    case("interpolation_of_an_unknown_resolver", "rounds=${{nope:3}}", "quiet=true", module="experiments.simulate",
         expected="error: rounds: Unsupported interpolation type nope (in ${{nope:3}}); correct the ${{...}} in "
                  "rounds, or give rounds its value"),
    # out_dir, which the entry point reads before the run's checks
    case("interpolation_in_out_dir", *SMALL, out_dir="${{oc.env:DANE_TEST_UNSET_VARIABLE}}/run",
         module="experiments.simulate",
         expected="error: out_dir: Environment variable 'DANE_TEST_UNSET_VARIABLE' not found (in "
                  "${{oc.env:DANE_TEST_UNSET_VARIABLE}}/run); set DANE_TEST_UNSET_VARIABLE in the environment, or "
                  "give out_dir its value"),
]
OWN_PROCESS = ("key_typo", "seed_text", "monitor_typo")  # cli(), run_spec(), inside the run


def mongo_stores(tmp: Path, X: np.ndarray, y: np.ndarray) -> None:
    """{tmp}/store: data set t (complete) and data set short (9 rows, one lost: its manifest still uploading);
    {tmp}/extra_store: data set t, 9 rows and a copy of row 5; {tmp}/cut_store: data set t, its data file cut in half
    (between two documents: the engine's assert, where a cut inside one is InvalidBSON, tests/test_mongo_store.py)."""
    import importlib.util

    if importlib.util.find_spec("mongita") is None:
        return  # the rows then fail with mongita's one line, which names pip install mongita
    from dane.data.mongo_push import push_table
    from dane.data.mongo_store import connect
    from dane.data.table import Table

    store = connect(str(tmp / "store"), create=True)
    push_table(store, "t", Table(X=X, y=y.astype(float), name="t", notes=[]), fingerprint_of="t")
    push_table(store, "short", Table(X=np.ones((9, 2)), y=np.zeros(9), name="s", notes=[]), fingerprint_of="s")
    store.db["dane_manifest"].update_one({"_id": "short"}, {"$set": {"state": "uploading"}})
    store.db["short"].delete_one({"id": 9})
    extra = connect(str(tmp / "extra_store"), create=True)
    push_table(extra, "t", Table(X=np.ones((9, 2)), y=np.zeros(9), name="t", notes=[]))
    extra.db["t"].insert_one({**extra.db["t"].find_one({"id": 5}), "_id": "copy of 5"})
    push_table(connect(str(tmp / "cut_store"), create=True), "t", Table(X=X, y=y.astype(float), name="t", notes=[]))
    data = tmp / "cut_store" / "dane.t" / "$.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


#: the rows' folder inside the session batch's (``{tmp}`` of a row below): their files, their working folder,
#: where a Hydra folder a row must not make would appear
FOLDER = "bad_input"


def probe_folder(tmp: Path) -> None:
    """``tmp/FOLDER`` with `probe_files`, before the batch."""
    (tmp / FOLDER).mkdir()
    probe_files(tmp / FOLDER)


def probe_files(tmp: Path) -> None:
    """The files the rows name."""
    rows = "\n".join(f"{i % 2} 1:{i}.5 2:{i % 3}" for i in range(12))
    (tmp / "nan.svm").write_text("# a comment line\n" + rows.replace("1 1:1.5 2:1", "1 1:1.5 2:nan") + "\n")
    (tmp / "inf_label.svm").write_text(rows.replace("1 1:1.5", "inf 1:1.5") + "\n")
    (tmp / "garbled.svm.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(7, 250)) * 3)
    X = np.arange(24, dtype=float).reshape(8, 3)
    y = np.arange(8) % 2
    np.savez(tmp / "nan.npz", X=np.where(np.arange(24).reshape(8, 3) == 3, np.nan, X), y=y)
    Xs = np.zeros((8, 3))
    Xs[2, 1], Xs[5, 0] = np.inf, 1.0
    save_npz(tmp / "sparse_inf.npz", scipy.sparse.csr_matrix(Xs), y)
    table = "y,a,b\n" + "".join(f"{i % 2},{i}.5,{i % 3}\n" for i in range(12))
    (tmp / "inf.csv").write_text(table.replace("1,1.5,", "1,inf,"))
    (tmp / "nan.csv").write_text(table.replace("1,1.5,", "1,NaN,"))
    (tmp / "inf_label.csv").write_text(table.replace("0,2.5,", "inf,2.5,"))
    (tmp / "binary.csv").write_bytes(bytes(range(256)) * 8)
    (tmp / "mnist").mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (tmp / "mnist" / name).write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(7, 250)) * 3)
    (tmp / "not_json.json").write_text("alpha = 1e-4\n")
    (tmp / "binary.json").write_bytes(b"\xff\xfe\x00\x81" * 8)
    (tmp / "no_beta.json").write_text('{"alpha": 1e-4}\n')
    (tmp / "ps_calibration.json").write_text('{"alpha": 3e-4, "beta": 5e8, "gamma": 1e9, "topology": "ps"}\n')
    (tmp / "no_tail.json").write_text('{"alpha": 1e-4, "beta": 1e8}\n')
    (tmp / "negative_alpha.json").write_text('{"alpha": -1, "beta": 1e8}\n')
    (tmp / "machine_vm.json").write_text('{"alpha": 1e-4, "beta": 1e8, "machine": "vm"}\n')
    (tmp / "infinite_beta.json").write_text('{"alpha": 1e-4, "beta": Infinity}\n')
    (tmp / "odd_topology.json").write_text('{"alpha": 1e-4, "beta": 1e8, "topology": "tree"}\n')
    (tmp / "bad_tail.json").write_text('{"alpha": 1e-4, "beta": 1e9, "tail": {"probs": [0, 1], "excess_s": [1, 0]}}\n')
    (tmp / "finished").mkdir()
    (tmp / "finished" / "rounds.jsonl").write_text('{"round": 0, "objective": 1.0}\n')
    (tmp / "finished" / "summary.json").write_text('{"status": "converged"}\n')
    (tmp / "a_file").write_text("not a folder\n")
    (tmp / "unreadable.svm").write_text(rows + "\n")
    (tmp / "unreadable.svm").chmod(0)
    (tmp / "small.svm").write_text(rows + "\n")
    (tmp / "index_2e9.svm").write_text("1 2000000000:1\n0 1:1\n")
    mongo_stores(tmp, X, y)
    np.save(tmp / "array.npy", X)
    (tmp / "array.npy").rename(tmp / "array.npz")
    header = io.BytesIO()  # an .npz whose X declares 1e6 x 1e5 float64 (800 GB) and holds 64 bytes
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**5)})
    with zipfile.ZipFile(tmp / "huge_header.npz", "w") as archive:
        archive.writestr("X.npy", header.getvalue() + bytes(64))
        archive.writestr("y.npy", npy_bytes(np.zeros(10**6)))
    np.savez(tmp / "sparse_1e10.npz", X_data=np.ones(1), X_indices=np.array([5]), X_indptr=np.array([0, 1, 1]),
             X_shape=np.array([2, 10**10]), y=np.array([0.0, 1.0]))
    (tmp / "admissions").mkdir()
    (tmp / "admissions" / "admissions.csv").write_text("admit,gre,gpa,rank\n0,380,3.61,3\n1,inf,3.67,3\n")
    (tmp / "admissions_binary").mkdir()
    (tmp / "admissions_binary" / "admissions.csv").write_bytes(bytes(range(256)) * 8)
    (tmp / "admissions_one_class").mkdir()
    (tmp / "admissions_one_class" / "admissions.csv").write_text(
        "admit,gre,gpa,rank\n" + "".join(f"1,{300 + 10 * i},3.{i},{i % 4 + 1}\n" for i in range(10)))
    (tmp / "ones.csv").write_text(table.replace("\n0,", "\n1,"))
    (tmp / "zeros.svm").write_text("".join(f"0 1:{i}.5 2:{i % 3}\n" for i in range(12)))
    np.savez(tmp / "minus_ones.npz", X=X, y=-np.ones(len(X)))
    (tmp / "text.npz").write_text("a,b,y\n1,2,0\n3,4,1\n")
    sites = ["north", "south", "east"]
    (tmp / "clients.csv").write_text("y,a,site\n" + "".join(f"{i % 2},{i}.5,{sites[i % 3]}\n" for i in range(12)))
    (tmp / "client_missing.csv").write_text((tmp / "clients.csv").read_text().replace(",1.5,south", ",1.5,?"))
    np.savez(tmp / "clients.npz", X=X, y=y, groups=np.arange(8) % 3)
    (tmp / "qid.svm").write_text("".join(f"{i % 2} qid:{1 + i // 6} 1:{i}.5 2:{i % 3}\n" for i in range(12)))
    (tmp / "read_only").mkdir()
    (tmp / "read_only").chmod(0o555)
    (tmp / "checkpoint_read_only" / "checkpoint").mkdir(parents=True)
    (tmp / "checkpoint_read_only" / "checkpoint").chmod(0o555)
    (tmp / "my_conf" / "problem").mkdir(parents=True)
    (tmp / "my_conf" / "problem" / "mine.yaml").write_text((REPO / "conf/problem/ridge_synthetic.yaml").read_text())
    (tmp / "my_conf" / "algorithm").mkdir()
    (tmp / "my_conf" / "algorithm" / "nowhere.yaml").write_text("_target_: dane_s68_nowhere.NowhereConfig\n"
                                                                "name: nowhere\nlr: 0.1\n")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@contextmanager
def address_space_limit(tmp: Path):
    """``ulimit -v``: 1.5 GB of address space beyond what the batch process maps now."""
    import resource

    with open("/proc/self/status") as f:
        mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 1_500_000_000, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


#: ``ulimit -f`` of `file_size_limit`: above config.yaml and a checkpoint part of `SMALL` (about 10 kB with the local
#: work counts, `dane.work`), below its rounds.jsonl after about 30 of 80 rounds (about 0.7 kB a record), so that the
#: log is the file that fills up past a checkpoint
FULL_AT_BYTES = 20_000


@contextmanager
def file_size_limit(tmp: Path):
    """A file system that fills up mid-run, as a process meets it past ``ulimit -f``: a write fails (EFBIG;
    Python ignores SIGXFSZ), and the files written before stay whole."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FULL_AT_BYTES, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextmanager
def thread_limit(tmp: Path):
    """A process that can start two simulated worker threads and no third (``RuntimeError: can't start new
    thread``, as 10,000 workers meet it under ``ulimit -v``).  No worker computes before all have started
    (`dane.comm.threads.ThreadGroup.run`): the two started go on once the third has failed, worker 0 opens its run
    folder before its first collective, and there both stop."""
    import threading

    start = threading.Thread.start

    def limited(self):
        if self.name.startswith("worker-") and int(self.name.removeprefix("worker-")) >= 2:
            raise RuntimeError("can't start new thread")
        start(self)

    threading.Thread.start = limited
    try:
        yield
    finally:
        threading.Thread.start = start


@contextmanager
def nul_filled_log(tmp: Path):
    """A run with a committed checkpoint (round 6) whose rounds.jsonl a machine crash left as NUL bytes."""
    run_in_batch("experiments.train", *SMALL, "rounds=6", "checkpoint_every=3", f"out_dir={tmp / FOLDER / 'nul_log'}")
    log = tmp / FOLDER / "nul_log" / "rounds.jsonl"
    log.write_bytes(b"\0" * log.stat().st_size)
    yield


@contextmanager
def silent_wait(tmp: Path):
    """A rank other than 0 that refuses waits `experiments.train.SILENT_EXIT_DELAY_S` before its silent exit, for its
    launcher to stop it once rank 0 has spoken; no launcher stops a row of the batch, so there the wait returns at
    once and the seconds each row asked for are noted in ``{tmp}/silent_waits``, a line a row
    (`test_a_silent_rank_asks_for_the_launchers_wait`)."""
    import time

    sleep, asked = time.sleep, []
    time.sleep = asked.append
    try:
        yield
    finally:
        time.sleep = sleep
        with open(tmp / "silent_waits", "a") as waits:
            waits.write(json.dumps(asked) + "\n")


def run_in_batch(module: str, *args: str) -> None:
    """``python -m module args`` in the batch process, which must succeed."""
    import runpy

    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__")
    except SystemExit as exc:
        assert not exc.code, f"{module} {' '.join(args)} exited {exc.code}"


def out_dir(row: Case, tmp: Path) -> Path:
    return Path(row.out_dir.format(tmp=tmp, name=row.name))


def argv(row: Case, tmp) -> list[str]:
    return [a.format(tmp=tmp) for a in row.args] + [f"out_dir={out_dir(row, tmp)}"]


def register(row: Case) -> str:
    """``row`` as a row of the session's batch process (tests/runs.py), named ``bad_input:<name>``."""
    folder = "{tmp}/" + FOLDER
    around = row.around or ("silent_wait" if row.lines == 0 else "")  # a silent rank's wait, noted, not slept
    return runs.command(f"bad_input:{row.name}", *argv(row, folder), module=row.module, env=row.env, cwd=folder,
                        around=f"test_bad_input:{around}" if around else "", watch=str(out_dir(row, folder)))


def own_process(tmp: Path, names: list[str]) -> dict:
    """In the fresh interpreter (tests/runs.py): each named row as its own ``python -m experiments.train``,
    started in ``tmp/own`` and writing under it: {name: {rc, stderr}}."""
    folder = tmp / "own"
    folder.mkdir()
    said = {}
    for name in names:
        row = replace(next(r for r in CASES if r.name == name), out_dir=str(folder / name))
        proc = subprocess.run([sys.executable, "-m", "experiments.train", *argv(row, folder)], cwd=folder,
                              env=runs.process_env(), capture_output=True, text=True, timeout=300)
        said[name] = {"rc": proc.returncode, "stderr": proc.stderr}
    return said


def assert_refused(row: Case, tmp: Path, rc: int, stderr: str, existed: bool, unchanged: bool) -> None:
    lines = stderr.splitlines()
    assert rc == 2, stderr
    assert len(lines) == row.lines, stderr
    if row.lines:
        assert lines[0].startswith("error: ") and row.expected.format(tmp=tmp) in lines[0], lines[0]
    target = out_dir(row, tmp)
    if row.kept:
        assert_kept(target, lines[0])
    elif existed:  # the refused run's directory was there before it: left byte for byte
        assert unchanged
    else:
        assert not target.exists()  # not even an empty folder: the corrected command can use the same out_dir
    assert not any((tmp / name).exists() for name in ("sweep", "results", "outputs", "multirun"))


def assert_kept(run_dir: Path, line: str) -> None:
    """A run stopped mid-run by its out_dir keeps what its line says: rounds 0..n-1 as whole records (a last
    line torn by the failed write aside) and the committed checkpoint, whose parts are there."""
    lines = (run_dir / "rounds.jsonl").read_bytes().decode().splitlines(keepends=True)
    whole = [json.loads(text) for text in lines if text.endswith("\n")]
    assert len(lines) - len(whole) <= 1 and [r["round"] for r in whole] == list(range(len(whole)))
    assert f"kept: rounds 0-{len(whole) - 1} in rounds.jsonl" in line
    marker = run_dir / "checkpoint" / "COMMITTED"
    if "no checkpoint" in line:
        assert not marker.exists()
        return
    k = json.loads(marker.read_text())["round"]
    assert 0 < k <= len(whole) and (run_dir / "checkpoint" / f"round{k}" / "rank0.pt").stat().st_size > 0
    assert f"and the checkpoint of round {k}; free space or make it writable, then rerun with resume=auto " \
           f"out_dir={run_dir} to continue from round {k}" in line


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name, marks=[pytest.mark.needs_horovod] if row.horovod else [])
                                 for row in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(row, commands):
    if row.permissions and runs.without_dac_override() is None:
        pytest.skip("root, and setpriv cannot drop CAP_DAC_OVERRIDE here: file permissions do not bind")
    result = commands[register(row)]
    assert_refused(row, commands.tmp / FOLDER, result["rc"], result["stderr"], result["existed"], result["unchanged"])


def test_a_silent_rank_asks_for_the_launchers_wait(commands):
    """Each row of a rank other than 0 (``lines=0``) ended silently after asking for one wait of
    `experiments.train.SILENT_EXIT_DELAY_S`, no other (`silent_wait`)."""
    from dane.experiments.train import SILENT_EXIT_DELAY_S

    silent = [row for row in CASES if row.lines == 0]
    assert len(silent) == 3 and all(commands[register(row)]["rc"] == 2 for row in silent)
    waits = [json.loads(line) for line in (commands.tmp / "silent_waits").read_text().splitlines()]
    assert waits == [[SILENT_EXIT_DELAY_S]] * len(silent)


@pytest.mark.parametrize("name", OWN_PROCESS)
def test_as_its_own_process(name, fresh):
    """The same line from ``python -m experiments.train``: one row per way a process ends on bad input."""
    said = fresh["jobs"]["bad_input:own_process"]
    assert "ok" in said, said.get("error")
    row = replace(next(r for r in CASES if r.name == name), out_dir=str(fresh.tmp / "own" / name))
    assert_refused(row, fresh.tmp / "own", said["ok"][name]["rc"], said["ok"][name]["stderr"], existed=False,
                   unchanged=False)


for _row in CASES:  # the session's batch runs the rows of the modules it tests
    register(_row)
runs.prepare(probe_folder)
runs.job("bad_input:own_process", "test_bad_input:own_process", list(OWN_PROCESS))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_an_occupied_out_dir_stops_every_rank_with_rank_0s_line(tmp_path, launcher):
    """Only rank 0 reads the run directory: it sends its refusal to the others before any collective, so they stop
    with it, silent, instead of waiting for rank 0 and then saying they lost a peer mid-run; the run there is kept."""
    held = tmp_path / "held"
    held.mkdir()
    (held / "rounds.jsonl").write_text('{"round": 0, "objective": 1.0}\n')
    (held / "summary.json").write_text('{"status": "converged"}\n')
    proc = train(*SMALL, f"out_dir={held}", launcher=horovodrun(2) if launcher == "horovodrun" else torchrun(2))
    said = [line for line in proc.stderr.splitlines() if "error: " in line]
    line = (f"error: out_dir={held} already holds a run (rounds.jsonl, summary.json); choose a new out_dir, or "
            "replace it with overwrite=true (dane.fit: overwrite=True)")
    assert said == [f"[0]<stderr>:{line}" if launcher == "horovodrun" else line], proc.stderr
    # the silent rank: no traceback (torchrun's SIGTERM once rank 0 had exited was one, LauncherTerminated)
    assert "[1]<stderr>:Traceback" not in proc.stderr and "[rank1]:" not in proc.stderr, proc.stderr
    assert (held / "rounds.jsonl").read_text() == '{"round": 0, "objective": 1.0}\n'


@pytest.mark.slow
def test_horovodrun_prints_the_workers_line_once():
    """Under a launcher every rank finds the same bad config; rank 0 says so, the others exit 2 silently."""
    proc = train("workers=3", *SMALL, launcher=horovodrun(2))
    said = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert said == ["[0]<stderr>:error: workers=3 but the launcher started 2 process(es); drop workers= under "
                    "horovodrun/torchrun or launch 3 processes"], proc.stderr
    assert "exit with status code 2." in proc.stdout  # the first rank to end; horovodrun then stops the other


def test_memory_is_estimated_before_anything_is_allocated(monkeypatch):
    """problem.dim=30000 (7.2 GB per d x d Hessian) is refused with the numbers, against the memory available."""
    from dane import checks
    from dane.errors import ConfigError
    from dane.experiments.config import run_spec

    default, cholesky = (composed("problem.dim=30000", "workers=8"),
                         composed("problem.dim=30000", "workers=8", "problem.local_solver=cholesky",
                                  "problem.factorization=cholesky"))  # d x d, not Woodbury's n_i x n_i
    monkeypatch.setattr(checks, "available_memory", lambda: 2_000_000_000)
    with pytest.raises(ConfigError) as err:
        run_spec(default)  # cg (d > 2000): no d x d matrix, but the 18000 x 30000 data
    assert str(err.value) == ("problem.dim=30000 with problem.n_samples=18000 and 8 workers needs about 4.3 GB of "
                              "memory (the 18000 x 30000 data 4.3 GB) but 2.0 GB is available; lower problem.dim or "
                              "problem.n_samples")
    monkeypatch.setattr(checks, "available_memory", lambda: 64_000_000_000)
    assert run_spec(default).problem.dim == 30000  # fits: refused nothing, allocated nothing yet
    with pytest.raises(ConfigError, match=r"needs about 119\.5 GB of memory \(the 18000 x 30000 data 4\.3 GB, 8 local "
                                          r"30000 x 30000 Hessian\(s\) with a factor each 115\.2 GB\) but 64\.0 GB is "
                                          r"available; use problem\.local_solver=cg \(no d x d matrix\)"):
        run_spec(cholesky)
    monkeypatch.setattr(checks, "available_memory", lambda: None)  # unknown: no refusal on a guess
    assert run_spec(cholesky).comm.workers == 8


def test_memory_counts_the_batched_simulators_copies(monkeypatch):
    """From 32 workers the simulator stacks the shards (sim.batched=auto): the rows twice, and Woodbury's row
    Gram matrices with their eigenvectors (2 x 8 x N x n_i bytes), where one thread a worker holds the rows once."""
    from dane import checks
    from dane.errors import ConfigError
    from dane.experiments.config import run_spec

    overrides = ["problem.dim=1500", "problem.n_samples=32000", "workers=32"]  # n_i = 1000 < d: Woodbury
    batched, threads = composed(*overrides), composed(*overrides, "sim.batched=false")
    monkeypatch.setattr(checks, "available_memory", lambda: 1_000_000_000)
    with pytest.raises(ConfigError) as err:
        run_spec(batched)
    assert str(err.value) == (
        "problem.dim=1500 with problem.n_samples=32000 and 32 workers needs about 1.3 GB of memory (the 32000 x 1500 "
        "data 0.8 GB (held twice: stacked for sim.batched), 32 row Gram matrices with their eigenvectors 0.5 GB) but "
        "1.0 GB is available; use sim.batched=false (one thread a worker, one copy of the rows), lower problem.dim or "
        "problem.n_samples")
    assert run_spec(threads).comm.batched == "false"  # 0.4 GB of rows: fits


def test_memory_counts_a_sparse_shards_transpose(monkeypatch):
    """A sparse shard builds its transpose (`LinearModelShard.XT`: a CSR of d rows over the same non-zeros), so its
    rows count twice plus a row pointer of d; the check counted the n-row CSR alone."""
    import numpy as np
    import scipy.sparse
    import torch

    from dane import checks
    from dane.errors import ConfigError
    from dane.problems.linear_models import check_memory

    monkeypatch.setattr(checks, "address_space_left", lambda: None)
    monkeypatch.setattr(checks, "available_memory", lambda: 130_000_000_000)
    wide = scipy.sparse.csr_matrix((np.ones(2), np.array([0, 5]), np.array([0, 1, 2])), shape=(2, 10**9))
    with pytest.raises(ConfigError) as err:  # 8 x 10^9 bytes of the transpose's row pointer, 128 GB of vectors
        check_memory(wide, 1, "cg", "wide.svm", torch.float64)
    assert str(err.value).startswith(
        "data wide.svm with d=1000000000 features needs about 136.0 GB of memory (2 rows and their transpose 8.0 GB, "
        "16 vectors of d 128.0 GB) but 130.0 GB is available; ")
    # 1000 x 1000 at half density: (8 + 8) x 500,000 bytes a CSR, twice, where 8.0 MB were counted
    full = scipy.sparse.random(1000, 1000, density=0.5, format="csr", random_state=0)
    monkeypatch.setattr(checks, "available_memory", lambda: 12_000_000)
    with pytest.raises(ConfigError, match=r"\(1000 rows and their transpose 0\.0 GB, 16 vectors of d 0\.0 GB\)"):
        check_memory(full, 1, "cg", "half.svm", torch.float64)
    monkeypatch.setattr(checks, "available_memory", lambda: 16_200_000)
    check_memory(full, 1, "cg", "half.svm", torch.float64)  # 16,016,000 + 128,000 bytes: fits


def test_memory_counts_a_float32_synthetic_runs_rows_in_float32_and_the_float64_rows_they_are_drawn_in(monkeypatch):
    """ridge_synthetic draws its rows in float64 and converts them: a float32 run holds its rows at 4 bytes a value,
    and the shard being converted at 8 more (the batched simulator: the data set and its stacked copy in float64,
    then that copy in float32), where the check counted 8 bytes a value whatever the dtype."""
    import torch

    from dane import checks
    from dane.errors import ConfigError
    from dane.experiments.config import run_spec
    from dane.run_config import check_memory

    threads, batched = (composed("problem.dim=30000", "workers=8", "problem.optimum=none", "dtype=float32"),
                        composed("problem.dim=1500", "problem.n_samples=32000", "workers=32",
                                 "dtype=float32"))  # the second: Woodbury, stacked
    monkeypatch.setattr(checks, "address_space_left", lambda: None)
    monkeypatch.setattr(checks, "available_memory", lambda: 3_000_000_000)
    spec = run_spec(threads)  # 4 x 18000 x 30000 + 8 x 2250 x 30000 bytes: 2.7 GB (it counted 4.3 GB: refused)
    monkeypatch.setattr(checks, "available_memory", lambda: 2_000_000_000)
    with pytest.raises(ConfigError) as err:
        run_spec(threads)
    assert str(err.value) == (
        "problem.dim=30000 with problem.n_samples=18000 and 8 workers needs about 2.7 GB of memory (the 18000 x 30000 "
        "data 2.7 GB (in float32, with a shard's float64 rows while it is converted)) but 2.0 GB is available; lower "
        "problem.dim or problem.n_samples")
    # under a launcher, one worker's 2250 rows: 4 + 8 bytes a value, 0.8 GB (it counted 0.5 GB)
    monkeypatch.setattr(checks, "available_memory", lambda: 700_000_000)
    with pytest.raises(ConfigError, match=r"needs about 0\.8 GB of memory \(the 2250 x 30000 data 0\.8 GB \(in float32"):
        check_memory(spec.problem, 8, simulated=False, dtype=torch.float32)
    check_memory(spec.problem, 8, simulated=False)  # float64: 0.5 GB, as before
    monkeypatch.setattr(checks, "available_memory", lambda: 1_400_000_000)
    with pytest.raises(ConfigError) as err:  # (8 + 8 + 4) x 32000 x 1500 bytes of rows (it counted 16: 1.3 GB, passed)
        run_spec(batched)
    assert str(err.value) == (
        "problem.dim=1500 with problem.n_samples=32000 and 32 workers needs about 1.5 GB of memory (the 32000 x 1500 "
        "data 1.0 GB (held twice in float64: stacked for sim.batched, then in float32), 32 row Gram matrices with "
        "their eigenvectors 0.5 GB) but 1.4 GB is available; use sim.batched=false (one thread a worker, one copy of "
        "the rows), lower problem.dim or problem.n_samples")

def test_memory_counts_a_float32_runs_float64_copy_for_its_reference(monkeypatch):
    """A float32 run at problem.optimum=auto solves its reference on a float64 copy of its rows
    (`dane.problems.optimum.attach`): 4 + 8 bytes a value while that solve runs, where the check counted 8."""
    import numpy as np
    import torch

    from dane import checks
    from dane.errors import ConfigError
    from dane.problems import LogReg
    from dane.problems.linear_models import check_memory

    monkeypatch.setattr(checks, "available_memory", lambda: 10_000_000_000)
    monkeypatch.setattr(checks, "address_space_left", lambda: None)
    X = np.broadcast_to(np.float64(0.0), (100_000, 10_000))  # a shape, no memory
    check_memory(X, 1, "cg", "big.npz", torch.float32)        # 4.0 GB of rows
    check_memory(X, 1, "cg", "big.npz", torch.float64)        # 8.0 GB, as before
    with pytest.raises(ConfigError) as err:
        check_memory(X, 1, "cg", "big.npz", torch.float32, float64_copy=True)
    assert str(err.value) == (
        "data big.npz with d=10000 features needs about 12.0 GB of memory (100000 rows 4.0 GB, their float64 copy for "
        "the reference optimum 8.0 GB, 16 vectors of d 0.0 GB) but 10.0 GB is available; check the data's feature "
        "count (data.n_features, a LIBSVM file's largest index, an .npz's X_shape), or problem.optimum=none (no "
        "float64 copy)")
    # a 200 x 50 float32 shard: 40,000 bytes of rows, 80,000 of the copy, 6,400 of vectors; 100,000 available
    monkeypatch.setattr(checks, "available_memory", lambda: 100_000)
    rows = np.random.default_rng(0).standard_normal((200, 50))
    labels = np.where(rows[:, 0] > 0, 1.0, -1.0)
    with pytest.raises(ConfigError, match=r"needs about 0\.0 GB of memory \(200 rows 0\.0 GB, their float64 copy "):
        LogReg(rows, labels, local_solver="cg", optimum="auto").build(0, 1, torch.float32)
    assert LogReg(rows, labels, local_solver="cg", optimum="auto").build(0, 1, torch.float64).dim == 50
    assert LogReg(rows, labels, local_solver="cg").build(0, 1, torch.float32).dim == 50


@pytest.mark.parametrize("line", [
    ["+algorithm.extra=1"],                                     # + adds a key: its dataclass refuses it (`build`)
    ["++rounds=4", "++sim.alpha=1e-3"],                         # ++ of a key the config has: an override
    ["+hydra.job.env_set.OMP_NUM_THREADS=1"],                   # Hydra's own keys: Hydra's to allow
    ["~early_stop"],
    ["-m", "algorithm.eta=1,2", "rounds=1,2"],                  # a sweep of values
    ["-m", "algorithm=dane,inexact_dane,aide", "algorithm.mu=0.1"],  # a key every swept choice has
    ["-m", "algorithm=sdane,fedprox", "++algorithm.clients_per_round=5"],  # one dane lacks: ++ sets it in each job
    ["hydra.run.dir=somewhere", "hydra/job_logging=disabled"],
    ["problem=digits_mlp", "model@problem.model=mlp", "problem.model.hidden=[32]"],
    ["problem=logreg", "data=csv", "data.path=x.csv", "data.target=y"],
    ["experiment=speedup"],
])
def test_valid_overrides_pass_the_key_check(line):
    from dane.experiments.overrides import check_keys

    check_keys(line, "config")


def test_a_sweep_key_the_default_choice_lacks_names_plus_plus():
    """Every swept method has ``clients_per_round``, the default ``algorithm=dane`` does not: Hydra composed the
    sweep's base config with dane and stopped on a page saying ``+`` (which then fails in each job)."""
    from dane.errors import ConfigError
    from dane.experiments.overrides import check_keys

    with pytest.raises(ConfigError) as err:
        check_keys(["-m", "algorithm=sdane,fedprox", "algorithm.clients_per_round=5"], "config")
    assert str(err.value) == (
        "algorithm.clients_per_round=5 with -m algorithm=sdane,fedprox: Hydra first composes the sweep's base "
        "config, algorithm=dane, which has no algorithm.clients_per_round; write ++algorithm.clients_per_round=5 to "
        "set it in every job")


@pytest.mark.parametrize("line, refused", [
    (["-m", "experiment=speedup", "out_dir=y"], "workers=1,2,4,8,16,64, problem.n_samples=6000,10000,14000,18000"),
    (["-m", "experiment=speedup", "workers=2", "out_dir=y"], "problem.n_samples=6000,10000,14000,18000)"),
    (["-m", "experiment=convergence", "algorithm.mu=0.1", "out_dir=y"], "algorithm=dane,admm,gd,osa"),
    (["-m", "experiment=speedup", "rounds=1,2", "out_dir=y"], "(rounds=1,2)"),  # the command line's sweep: as before
    (["-m", "experiment=speedup"], None),                                     # each job under hydra.sweep.dir
    (["-m", "experiment=speedup", "out_dir=d/${hydra:job.num}"], None),       # the user's layout
    (["-m", "experiment=speedup", "out_dir=a,b"], None),
    (["-m", "experiment=speedup", "workers=2", "problem.n_samples=600", "out_dir=y"], None),  # one job: a run
    (["experiment=speedup", "out_dir=y"], None),                             # no -m: one run
    (["-m", "workers=1,2", "out_dir=null"], None),                           # null: each job's own directory
    # the file's out_dir names the job, but the command line's fixed one replaces it (read unresolved: it was skipped)
    (["-m", "experiment=speedup", "+hydra.sweeper.params.out_dir=d/${hydra:job.num}", "out_dir=y"], "workers=1,2,4"),
])
def test_a_sweep_of_an_experiment_file_into_one_out_dir_is_refused(line, refused):
    from dane.errors import ConfigError
    from dane.experiments.overrides import check_sweep_out_dir

    if refused is None:
        check_sweep_out_dir(line, "simulate")
        return
    with pytest.raises(ConfigError, match="with -m puts every job of the sweep") as said:
        check_sweep_out_dir(line, "simulate")
    assert refused in str(said.value) and str(said.value).startswith("out_dir=y ") and "\n" not in str(said.value)


def test_a_config_dir_that_is_not_a_folder_is_one_line(tmp_path, monkeypatch):
    """Hydra searched a --config-dir that does not exist silently: a misspelt folder's yaml was refused as unknown,
    the package's conf/ alone named as searched."""
    from dane.errors import ConfigError
    from dane.experiments.overrides import check_group_choices

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "problem").mkdir(parents=True)
    (tmp_path / "mine" / "problem" / "own.yaml").write_text("name: own\n")
    check_group_choices(["--config-dir", "mine", "problem=own"])
    for argv in (["--config-dir", "mien", "problem=own"], ["--config-dir=mien"], ["-cd", "mien", "rounds=1"]):
        with pytest.raises(ConfigError) as error:
            check_group_choices(argv)
        assert str(error.value) == (f"--config-dir mien is not a folder (from {tmp_path}); name the folder that holds "
                                    "your algorithm/, problem/ or data/ yamls (docs/extending.md)")


def test_a_sweep_of_a_range_of_step_zero_is_one_line():
    from dane.errors import ConfigError
    from dane.experiments.overrides import _sweep_variants

    with pytest.raises(ConfigError, match=r"^algorithm.mu=range\(0,1,0\): range\(\) arg 3 must not be zero; give "
                                          r"the sweep a non-zero step$"):
        _sweep_variants(["algorithm.mu=range(0,1,0)"], None)


@pytest.mark.parametrize("line, refused", [
    (["-m", "rounds=6,8", "resume=runs/ck"], True),       # every job would continue runs/ck, each replacing the last
    (["-m", "rounds=6,8", "resume=auto", "out_dir=d/${hydra:job.num}"], False),  # each job its own directory
    (["-m", "resume=runs/a,runs/b", "rounds=8"], False),  # a run resumed per job
    (["-m", "seed=1,2", "resume=runs/${hydra:job.num}"], False),  # a run of its own per job
    (["rounds=8", "resume=runs/ck"], False),              # no -m: one run
])
def test_a_sweep_that_resumes_one_run_in_every_job_is_refused(line, refused):
    from dane.errors import ConfigError
    from dane.experiments.overrides import check_sweep_out_dir

    if not refused:
        check_sweep_out_dir(line, "config")
        return
    with pytest.raises(ConfigError, match=r"^resume=runs/ck with -m continues one run in every job of the sweep "
                                          r"\(rounds=6,8\), each replacing the last; resume one run without -m"):
        check_sweep_out_dir(line, "config")


def test_resume_with_another_out_dir_is_refused(tmp_path):
    """resume=DIR continues DIR in place: an out_dir naming another directory was ignored, never made."""
    from omegaconf import OmegaConf

    from dane.errors import ConfigError
    from dane.loop.resume import resume_dir

    (tmp_path / "ck" / "checkpoint").mkdir(parents=True)
    cfg = OmegaConf.create({"resume": str(tmp_path / "ck"), "out_dir": str(tmp_path / "other"), "rounds": 8})
    with pytest.raises(ConfigError, match=rf"^resume={tmp_path}/ck continues that run in its own directory, but "
                                          rf"out_dir={tmp_path}/other names another; drop out_dir"):
        resume_dir(cfg, 2)

