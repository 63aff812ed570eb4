"""A count a user reads that can be 1 says "1 round", "1 worker", not "1 rounds" (`dane.errors.plural`): the run's
last line and its stop line, the sharding and data notes, and the refusals whose count is a config value.  And an
error's text quoted in a line ends at a word (`dane.errors.brief`)."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from omegaconf import OmegaConf

import dane
from dane.data.files import CSVSource, LibSVMSource, NPZSource, save_npz
from dane.errors import ConfigError, DataError, brief, plural
from dane.loop.resume import finished_run, keep_unfinished, refuse_finished
from dane.loop.stopping import StopRule
from dane.numerics.inner import refuse_oversized
from dane.sampling import ClientSampler
from dane.synthetic.sparse_data import write_sparse_libsvm


def test_plural():
    assert [plural(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert plural(32561, "row", ",") == "32,561 rows" and plural(None, "round") == "None rounds"


def test_brief_quotes_an_errors_text_on_one_line_and_cuts_it_at_a_word():
    assert brief(ValueError("a  b\n c")) == "a b c" and brief(ValueError()) == ""
    assert brief(ValueError("abc defg hij"), 8) == "abc defg ..."  # the word ends at the limit: kept
    assert brief(ValueError("abc defg hij"), 7) == "abc ..." and brief(ValueError("abcdefgh"), 4) == "abcd ..."
    assert brief(ValueError("abc defg hij"), 12) == "abc defg hij"


def test_brief_keeps_a_last_word_that_is_a_path(tmp_path):
    """An OSError's text ends in its file: cut at the last space, "[Errno 21] Is a directory: ..." lost the name.  The
    words before a path now make room for it (down to half the limit), and a path longer than that keeps its end."""
    name = "run_of_the_second_rack/alpha_beta.json"
    err = IsADirectoryError(21, "Is a directory", f"/home/user/experiments/{name}")
    assert brief(FileNotFoundError(2, "No such file or directory", "data/a9a.txt"), 30) == \
        "[Errno 2] No ... 'data/a9a.txt'"  # the words cut, the path whole
    assert brief(err, 75) == f"[Errno 21] Is a directory: ... eriments/{name}'"  # the path's front cut
    assert brief(err, 20) == "[Errno 21] ... eta.json'"
    assert brief(ValueError("see /a/b.png now"), 12) == "see /a/b.png ..."  # a path not last: cut at a word
    path = tmp_path / ("calibrations_of_machine_a_in_the_second_rack_" * 2) / "alpha_beta.json"
    path.mkdir(parents=True)
    from dane.comm.cost import AlphaBeta

    with pytest.raises(ConfigError) as refused:
        AlphaBeta.load(path)
    assert f"is not a calibration file ([Errno 21] Is a directory: ... " in str(refused.value)
    assert "_second_rack_/alpha_beta.json'); re-run `dane calibrate` to remake it" in str(refused.value)


def test_a_one_round_run_says_round(capsys):
    """rounds=1: the run said "stop: 1 rounds" and "after 1 rounds"."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 1))
    dane.fit(dane.problems.LogReg(X, (X[:, 0] > 0).astype(float), lam=0.1), "gd", workers=1, rounds=1, quiet=False)
    said = capsys.readouterr()
    assert "stop: 1 round" in said.err.splitlines()
    # one GD step from 0 on the 1-D logistic loss, by hand: lr = 2/(L + μ) = 1/L in one dimension, L = ¼ mean(x²) + λ
    x, y = X[:, 0], (X[:, 0] > 0).astype(float)
    w = -np.mean((0.5 - y) * x) / (0.25 * np.mean(x * x) + 0.1)
    objective = np.mean(np.logaddexp(0, x * w) - y * x * w) + 0.05 * w * w
    assert re.fullmatch(r"gd on logreg, 1 worker\(s\), local: max_rounds \(rounds = 1\) after 1 round, final objective "
                        + re.escape(f"{objective:.8e}") + r", 0 bytes sent, [0-9.]+ s", said.out.splitlines()[-1])


def test_the_notes_of_one_worker_one_row_and_one_feature(tmp_path):
    rows, notes = dane.ShardingKeys(sharding="dirichlet").deal(np.array([0.0, 1.0, 1.0]), 1, seed=0)
    assert notes == ["sharding: dirichlet (alpha=1) on labels, seed 0: 1 worker, rows 3", "worker 0: 3 rows; 0: 1, 1: 2"]
    rows, notes = dane.ShardingKeys(sharding="quantity", exponent=2.0).deal(np.zeros(3), 2, seed=0)
    assert [len(r) for r in rows] == [2, 1] and notes[2] == "worker 1: 1 row"
    path = tmp_path / "one.csv"
    path.write_text("y,a\n1,2.5\n")
    assert CSVSource(str(path), target="y", standardize="none").load().notes[0] == f"read 1 row x 1 feature from {path}"
    save_npz(tmp_path / "one.npz", sp.csr_matrix([[2.5]]), np.array([1.0]))
    assert NPZSource(str(tmp_path / "one.npz")).load().notes[0] == \
        f"read 1 row x 1 feature (sparse, 1 non-zero) from {tmp_path / 'one.npz'}"
    (tmp_path / "one.svm").write_text("1 1:2.5\n")
    assert LibSVMSource(str(tmp_path / "one.svm")).load().notes[0] == \
        f"read 1 row x 1 feature (1 non-zero, sparse) from {tmp_path / 'one.svm'}"
    for rows, counted in ((1, "1 non-zero"), (2, "2 non-zeros")):  # one feature: one non-zero a (unit) row
        written = write_sparse_libsvm(tmp_path / f"rcv1_like_{rows}.svm", rows, 1, seed=0).read_text()
        assert f"\n# synthetic.sparse_data.rcv1_like(n_rows={rows}, n_features=1, seed=0): {counted}\n" in written


def test_refusals_whose_count_is_one():
    with pytest.raises(ConfigError) as err:
        ClientSampler(SimpleNamespace(size=1, rank=0), 2)
    assert str(err.value) == "algorithm.clients_per_round=2 exceeds the 1 client; use at most 1 (or null for all)"
    stop = StopRule(rounds=10, monitor="objective", patience=1)
    assert stop.stopped_by("early_stopped", {"round": 3, "objective": 1.0}, {"round": 0, "objective": 1.0}) == \
        "objective not better by 0 for 1 round"
    with pytest.raises(ConfigError) as err:
        refuse_oversized("algorithm.batch_size", 2, 1)
    assert str(err.value) == ("algorithm.batch_size=2 exceeds this worker's 1 sample; use a smaller batch or null for "
                              "the full shard")


def test_resume_counts_one_record_and_one_round(tmp_path):
    (tmp_path / "rounds.jsonl").write_text('{"round": 0}\n')
    with pytest.raises(ConfigError, match=r"holds 1 record of an unfinished run .*\(it ran without checkpoint_every\)"):
        keep_unfinished(tmp_path, 0)
    (tmp_path / "rounds.jsonl").write_text('{"round": 0}\n{"round": 1}\n{"round": 2}\n')
    with pytest.raises(ConfigError, match=r"more than the 1 round \(checkpoint_every\) a restart before"):
        keep_unfinished(tmp_path, 1)
    (tmp_path / "summary.json").write_text('{"status": "converged", "rounds": 1}')
    with pytest.raises(ConfigError) as err:
        refuse_finished(tmp_path, 5)
    assert str(err.value) == (f"resume: {tmp_path} holds a finished run (converged after 1 round); there is nothing to "
                              "continue: drop resume and set overwrite=true to start it again, or use a new out_dir")
    cfg = OmegaConf.create({"resume": "auto", "out_dir": str(tmp_path), "rounds": 1})
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    assert finished_run(cfg) == f"resume=auto: {tmp_path} holds the finished run of this config (converged after 1 " \
        "round); nothing to do, kept as it was"


def test_parts_of_one_worker(tmp_path):
    for r in range(2):
        (tmp_path / f"p-{r}.csv").write_text(f"y,a\n{r},1\n")
    with pytest.raises(DataError, match="p-1.csv exists but the run launched only 1 worker; there are 2 parts"):
        CSVSource(str(tmp_path / "p-{rank}.csv"), target="y", standardize="none").load_part(0, 1)


def test_a_figure_reads_the_size_of_a_one_feature_data_set(tmp_path):
    """The figures' captions read a run's size from its data note ("read 100 rows x 1 feature from ...")."""
    import json

    from dane.paper_figs.common import run_setting

    for note, size in (("read 100 rows x 1 feature from f.csv", "100 rows x 1 feature"),
                       ("read 1 row x 30 features from f.csv", "1 row x 30 features"),
                       ("scikit-learn's bundled breast_cancer data: 569 rows x 30 features", "569 rows x 30 features")):
        (tmp_path / "summary.json").write_text(json.dumps({"notes": [note], "workers": 1}))
        assert run_setting(tmp_path)["size"] == size


@pytest.mark.parametrize("n", [1, 2])
def test_a_push_of_one_sample(tmp_path, n):
    """A push of a one-row table said "uploaded 1 samples", "already holds the 1 samples", "completed (found 0 of 1
    samples ...) 1 samples" and its run's note "fetched 1 of 1 samples"."""
    pytest.importorskip("mongita", reason="the embedded store needs mongita: pip install mongita (make setup)")
    from dane.data.mongo_source import MongoSource
    from dane.data.mongo_store import connect
    from dane.experiments.data import parser, push

    (tmp_path / "t.csv").write_text("y,a\n" + "".join(f"{i % 2},{i}.5\n" for i in range(n)))
    uri, samples = str(tmp_path / "store"), plural(n, "sample")
    args = parser().parse_args(["push", str(tmp_path / "t.csv"), "--target", "y", "--uri", uri, "--collection", "t"])
    assert push(args) == f"uploaded {samples} into collection t of {uri}"
    assert push(args) == f"collection t of {uri} already holds the {samples} (complete); nothing to do"
    store = connect(uri)
    store.db["dane_manifest"].update_one({"_id": "t"}, {"$set": {"state": "uploading"}})
    store.db["t"].delete_one({"id": n})
    assert push(args) == (f"completed (found {n - 1} of {samples} from an interrupted push) {samples} into "
                          f"collection t of {uri}")
    [note] = MongoSource(uri=uri, collection="t").load().notes
    assert note.startswith(f"fetched {n} of {samples} by id from collection t of {uri}, pushed from ")
    assert samples == ("1 sample" if n == 1 else "2 samples")


@pytest.mark.parametrize("n", [1, 2])
def test_the_standardization_notes_of_one_row_and_a_one_value_category(tmp_path, n):
    """"over 1 rows" (dense, sparse, CSV) and a category of one value "-> 1 columns"."""
    import scipy.sparse as sp

    from dane.data.scaling import standardize_matrix

    rows = "1 row" if n == 1 else f"{n} rows"
    X = np.arange(2.0 * n).reshape(n, 2) ** 2
    assert standardize_matrix(X.copy(), "all").split(";")[0] == f"standardized 2 column(s) to mean 0, std 1 over {rows}"
    assert standardize_matrix(sp.csr_matrix(X), "all").startswith(f"scaled 2 column(s) to std 1 over {rows}, not ")
    path = tmp_path / "one.csv"
    path.write_text("y,a,k\n" + "".join(f"{i},{i * i}.5,{'pq'[i]}\n" for i in range(n)))
    notes = CSVSource(str(path), target="y", categorical=("k",), standardize="numeric").load().notes
    assert notes[1].startswith(f"one-hot: 'k' -> {'1 column' if n == 1 else '2 columns'} (p")
    assert notes[2].split(";")[0] == f"standardized 1 numeric column(s) to mean 0, std 1 over {rows}"


@pytest.mark.parametrize("n", [1, 2])
def test_the_sweeps_lines_of_one_job_of_one_round(tmp_path, monkeypatch, n):
    """`synthetic.sweep.ensure` said "running 1 of 1 jobs" and "... converged after 1 rounds"; its runs replaced by
    their summaries (the lines are the point, not the runs)."""
    import io

    from dane.synthetic import sweep

    monkeypatch.setattr(sweep, "run_job", lambda job, out_dir: {"status": "converged", "rounds": n})
    log = io.StringIO()
    sweep.ensure([("algorithm=gd", f"rounds={k}") for k in range(n)], root=tmp_path, log=log)
    lines = log.getvalue().splitlines()
    assert lines[0] == f"running {n} of {'1 job' if n == 1 else '2 jobs'} into {tmp_path / 'sweeps/figures'}"
    assert lines[-1].endswith(f"algorithm=gd,rounds={n - 1}: converged after {'1 round' if n == 1 else '2 rounds'}")
