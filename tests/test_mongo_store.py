"""data=mongo (dane.data.mongo_store, mongo_push, mongo_source): push, read back, resume, train by id.

Everything runs on the embedded engine (mongita's disk store in a temporary folder); the server path
(``mongodb://``) is checked as far as no server allows: the URI's parsing, and the reading code given a
client object that answers a server's projection.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

pytest.importorskip("mongita", reason="the embedded store needs mongita: pip install mongita (make setup)")

from dane.data.files import CSVSource, LibSVMSource, NPZSource, save_npz  # noqa: E402
from dane.data.mongo_source import MongoSource  # noqa: E402
from dane.data import mongo_source, mongo_store  # noqa: E402
from dane.data.mongo_store import CHUNK_SIZE, Store, connect, server_database  # noqa: E402
from dane.errors import ConfigError, DataError  # noqa: E402
from dane.experiments.data import parser, push  # noqa: E402
import runs  # noqa: E402
from helpers import REPO, composed, env, flock_waits  # noqa: E402


def push_args(*argv: str) -> Namespace:
    return parser().parse_args(["push", *argv])


def write_files(tmp: Path) -> Path:
    """The module's small files in ``tmp``: t.csv (57 rows), t.svm (41), t.npz (33), an image folder and a big image."""
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    rows = ["y,a,b,kind"] + [f"{i % 2},{rng.normal():.17g},{rng.integers(0, 9)},{'pq'[i % 3 == 0]}" for i in range(57)]
    (tmp / "t.csv").write_text("\n".join(rows) + "\n")
    (tmp / "t.svm").write_text("".join(f"{i % 3} 2:{i}.25 7:{-i} 40:1e-3\n" if i % 4 else f"{i % 3} 5:1\n"
                                       for i in range(41)))
    save_npz(tmp / "t.npz", rng.standard_normal((33, 4)), rng.integers(0, 2, 33))
    from PIL import Image

    for label, count in (("circle", 3), ("square", 2)):
        (tmp / "img" / label).mkdir(parents=True)
        for k in range(count):
            Image.fromarray(rng.integers(0, 256, (9, 7), dtype=np.uint8)).save(tmp / "img" / label / f"{k}.png")
    big = tmp / "big" / "only"
    big.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(big / "noise.png")  # ~360 kB: 2 chunks
    return tmp


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return write_files(tmp_path_factory.mktemp("mongo"))


@pytest.mark.parametrize("kind", ["csv", "svm", "npz"])
def test_push_reads_back_the_file_source_table_exactly(files, tmp_path, kind):
    """Every row comes back bit for bit as the file source reads it, ids 1..n; a second push changes nothing."""
    extra = ["--target", "y", "--categorical", "kind"] if kind == "csv" else []
    args = push_args(str(files / f"t.{kind}"), "--uri", str(tmp_path), "--collection", "t", *extra)
    assert push(args).startswith("uploaded")
    source = {"csv": CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none"),
              "svm": LibSVMSource(str(files / "t.svm")), "npz": NPZSource(str(files / "t.npz"))}[kind]
    expected = source.load()
    stored = MongoSource(uri=str(tmp_path), collection="t")
    ids, y, manifest = stored.labels()
    assert ids.tolist() == list(range(1, expected.n + 1)) and manifest["state"] == "complete"
    got = stored.load()
    assert got.notes == [f"fetched {expected.n} of {expected.n} samples by id from collection t of {tmp_path}, pushed "
                         f"from {expected.name} (sha256 {manifest['fingerprint'][:16]}, push {manifest['push_id'][:12]})"]
    X, E = (got.X.toarray(), expected.X.toarray()) if kind == "svm" else (got.X, expected.X)
    assert np.array_equal(X, E) and np.array_equal(got.y, expected.y) and np.array_equal(y, expected.y)
    assert sp.issparse(got.X) == (kind == "svm")
    if kind == "csv":  # one field per column, by name
        assert manifest["columns"] == expected.feature_names
        doc = stored.store().db["t"].find_one({"id": 2})
        assert doc["a"] == expected.X[1, 0] and doc["_id"] == "2"
    assert push(args).endswith("nothing to do")
    assert stored.store().count("t") == expected.n
    # a relative name is looked for under --data-dir as a run's data.path is under data_dir: the same data set
    again = push_args(f"t.{kind}", "--data-dir", str(files), "--uri", str(tmp_path), "--collection", "t", *extra)
    assert push(again).endswith("nothing to do")


def test_images_and_gridfs_chunks(files, tmp_path):
    """An image folder: labels by sub-folder, pixels as Pillow reads the file, GridFS chunks that rejoin to the
    file's bytes; a re-push stores no second copy."""
    from PIL import Image

    assert push(push_args(str(files / "img"), "--uri", str(tmp_path), "--collection", "shapes")).startswith("uploaded")
    source = MongoSource(uri=str(tmp_path), collection="shapes")
    pixels, labels = source.images([5, 1, 4])
    order = [files / "img/square/1.png", files / "img/circle/0.png", files / "img/square/0.png"]
    assert labels.tolist() == [1.0, 0.0, 1.0]
    assert all(np.array_equal(p, np.asarray(Image.open(f))) for p, f in zip(pixels, order))
    push(push_args(str(files / "big"), "--uri", str(tmp_path), "--collection", "big"))
    store = connect(str(tmp_path))
    data = (files / "big/only/noise.png").read_bytes()
    (meta,) = list(store.find("big_files", {}))
    assert meta["length"] == len(data) and meta["chunkSize"] == CHUNK_SIZE and meta["filename"] == "only/noise.png"
    assert {"_id", "length", "chunkSize", "uploadDate", "filename", "metadata"} <= set(meta)
    chunks = sorted(store.find("big_chunks", {"files_id": meta["_id"]}), key=lambda c: c["n"])
    assert [c["n"] for c in chunks] == list(range(-(-len(data) // CHUNK_SIZE))) == [0, 1]
    assert b"".join(c["data"] for c in chunks) == data
    assert push(push_args(str(files / "img"), "--uri", str(tmp_path), "--collection", "shapes")).endswith("nothing to do")
    assert (store.count("shapes"), store.count("shapes_files"), store.count("shapes_chunks")) == (5, 5, 5)


KILLER = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from mongita.collection import Collection
done = [0]
insert_many = Collection.insert_many
def dying(self, docs, *a, **k):
    out = insert_many(self, docs, *a, **k)
    if self.name == "big_t":
        done[0] += len(docs)
        if done[0] >= {after}:
            os.kill(os.getpid(), signal.SIGKILL)
    return out
Collection.insert_many = dying
from dane.experiments.data import main
main(["push", {csv!r}, "--target", "y", "--uri", {uri!r}, "--collection", "big_t"])
"""


def killed_push(tmp) -> dict:
    """In the session's fresh interpreter (tests/runs.py): ``tmp/sigkill/big.csv`` (2400 rows) pushed to the store
    ``tmp/sigkill/store`` by a child process that SIGKILLs itself after 1000 rows: {returncode, stderr}."""
    folder = tmp / "sigkill"
    folder.mkdir()
    rng = np.random.default_rng(0)
    csv = folder / "big.csv"
    csv.write_text("y,a,b\n" + "".join(f"{i % 2},{rng.normal():.17g},{i}\n" for i in range(2400)))
    code = KILLER.format(repo=str(REPO), after=1000, csv=str(csv), uri=str(folder / "store"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    return {"returncode": proc.returncode, "stderr": proc.stderr}


KILLED = runs.job("mongo_store:killed_push", "test_mongo_store:killed_push")


def test_sigkill_mid_upload_is_detected_then_completed(fresh, tmp_path):
    """A push killed (SIGKILL) after 1000 of 2400 rows leaves a store a run refuses as short; the next push
    completes it with every row once, equal to the file.  The killed push is the fresh interpreter's job; its folder
    is copied here, so that the completing push leaves the shared one as the job wrote it."""
    done = fresh["jobs"][KILLED]
    assert "ok" in done, done.get("error")
    assert done["ok"]["returncode"] == -signal.SIGKILL, done["ok"]["stderr"]
    shutil.copytree(fresh.tmp / "sigkill", tmp_path, dirs_exist_ok=True)
    csv, uri = tmp_path / "big.csv", str(tmp_path / "store")
    source = MongoSource(uri=uri, collection="big_t")
    with pytest.raises(DataError, match=r"is short: 1000 of 2400 samples \(uploading\)"):
        source.manifest()
    line = push(push_args(str(csv), "--target", "y", "--uri", uri, "--collection", "big_t"))
    assert line.startswith("completed (found 1000 of 2400 samples from an interrupted push)"), line
    expected = CSVSource(str(csv), target="y", standardize="none").load()
    got = MongoSource(uri=uri, collection="big_t").load()
    assert np.array_equal(got.X, expected.X) and np.array_equal(got.y, expected.y)
    assert connect(uri).count("big_t") == 2400


def test_a_store_the_engine_cannot_read_is_uploaded_again(files, tmp_path):
    """A kill while mongita rewrote a collection's location index leaves a file it cannot decode: the next push
    says so, drops that data set's files and uploads it again; another data set of the store is untouched."""
    uri = str(tmp_path)
    push(push_args(str(files / "t.npz"), "--uri", uri, "--collection", "other"))
    args = push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(args)
    attrs = tmp_path / "dane.t" / "$.file_attrs"
    attrs.write_bytes(attrs.read_bytes()[: attrs.stat().st_size // 2])
    said = []
    from dane.data.mongo_push import push_table

    table = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none").load()
    line = push_table(connect(uri), "t", table, print_fn=said.append, fingerprint_of="x", replace=True)
    assert said and "cannot be read back" in said[0] and line.startswith("uploaded 57"), (said, line)
    assert np.array_equal(MongoSource(uri=uri, collection="t").load().X, table.X)
    assert np.array_equal(MongoSource(uri=uri, collection="other").load().X, NPZSource(str(files / "t.npz")).load().X)


def as_a_new_run(uri: str, collection: str = "t") -> MongoSource:
    """The data set as a run started now reads it: no store handle or labels kept from a read before."""
    mongo_source._STORES.clear()
    mongo_source._LABELS.clear()
    return MongoSource(uri=uri, collection=collection)


def test_a_data_set_pushed_again_is_read_afresh_and_an_unchanged_one_from_the_process_cache(files, tmp_path,
                                                                                         monkeypatch):
    """The labels a process read are kept under the data set's push (its manifest's push_id): read again unchanged,
    no sample is scanned; pushed again with --replace (by the command, or by push_table through another spelling of
    the folder, or through an engine of its own, as another process pushes), the new rows are read, not the 57 of
    the first push (it served those, and fetched ids 34..57 the 33 new rows lack)."""
    uri = str(tmp_path / "store")
    csv_args = ("--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(push_args(str(files / "t.csv"), *csv_args))
    csv = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none").load()
    npz = NPZSource(str(files / "t.npz")).load()
    source = as_a_new_run(uri)
    first = source.labels()
    scanned = []
    find = Store.find
    monkeypatch.setattr(Store, "find", lambda self, name, *rest: (scanned.append(name), find(self, name, *rest))[1])
    assert source.labels() is first and MongoSource(uri=uri, collection="t").labels() is first and scanned == []
    assert push(push_args(str(files / "t.csv"), *csv_args)).endswith("nothing to do")
    scanned.clear()  # the push's own check of the samples
    assert source.labels() is first and scanned == []

    push(push_args(str(files / "t.npz"), "--uri", uri, "--collection", "t", "--replace"))
    scanned.clear()
    ids, y, manifest = source.labels()
    assert scanned == ["t"] and manifest["source"] == "npz:t.npz"
    assert np.array_equal(ids, np.arange(1, 34)) and np.array_equal(y, npz.y)
    assert np.array_equal(source.load().X, npz.X)

    from dane.data.mongo_push import push_table

    monkeypatch.chdir(tmp_path)
    source.labels()  # the manifest as the engine caches it
    push_table(connect("store"), "t", csv, print_fn=lambda line: None, replace=True)
    assert np.array_equal(source.held_labels()[1], csv.y) and np.array_equal(source.load().X, csv.X)

    from mongita import MongitaClientDisk

    source.labels()
    elsewhere = MongitaClientDisk(uri + "/")  # another name for the folder: an engine and a cache of its own
    push_table(Store(elsewhere[mongo_store.DATABASE], uri, embedded=True, client=elsewhere), "t", npz,
               print_fn=lambda line: None, replace=True)
    assert np.array_equal(source.labels()[1], npz.y) and np.array_equal(source.load().X, npz.X)


def test_a_push_repairs_a_data_set_a_run_refuses(files, tmp_path):
    """A complete data set holding a duplicate of sample 5 (58 documents for 57 samples), or sample 9 under id 4000,
    is refused by a run; the same push drops the documents that are not samples 1..57 under their own ids and
    uploads those missing (it said "nothing to do": a dead end), and --replace uploads it whatever it holds."""
    uri = str(tmp_path)
    args = push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(args)
    expected = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none").load()
    store = connect(uri)
    duplicate = store.db["t"].find_one({"id": 5})
    duplicate["_id"] = "dup5"
    store.db["t"].insert_one(duplicate)
    with pytest.raises(DataError, match=r"^collection t of .* holds 58 documents for 57 samples \(complete\); push it "
                                        r"again to repair it: dane data push \.\.\. --collection t$"):
        as_a_new_run(uri).manifest()
    assert push(args) == (f"repaired (dropped 1 document(s) other than samples 1..57; found 57 of 57 samples) 57 "
                          f"samples into collection t of {uri}")
    got = as_a_new_run(uri).load()
    assert np.array_equal(got.X, expected.X) and np.array_equal(got.y, expected.y)
    assert connect(uri).count("t") == 57

    connect(uri).db["t"].update_one({"_id": "9"}, {"$set": {"id": 4000}})
    with pytest.raises(DataError, match=r"the ids are not 1\.\.57"):
        as_a_new_run(uri).labels()
    assert push(args).startswith("repaired (dropped 1 document(s) other than samples 1..57; found 56 of 57 samples)")
    got = as_a_new_run(uri).load()
    assert np.array_equal(got.X, expected.X) and np.array_equal(got.y, expected.y)
    assert [doc["id"] for doc in connect(uri).find("t", {"_id": "9"})] == [9]
    assert push(args).endswith("nothing to do")
    assert push(push_args(*[str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri,
                            "--collection", "t", "--replace"])) == f"uploaded 57 samples into collection t of {uri}"


@pytest.mark.parametrize("cut, error", [("half", "InvalidBSON: objsize too large"), ("all", "AssertionError")])
def test_a_run_on_a_store_the_engine_cannot_read_is_one_line(files, tmp_path, cut, error):
    """A data file cut short (half of it, or all: its documents' locations lie past its end) was a traceback from
    the engine's reads (InvalidBSON, mongita's assert); a run now gets one line naming the push that uploads it again,
    and after that push reads the rows."""
    uri = str(tmp_path)
    args = push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(args)
    data = tmp_path / "dane.t" / "$.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2] if cut == "half" else b"")
    with pytest.raises(DataError) as refused:
        as_a_new_run(uri).load()
    assert str(refused.value) == (f"collection t of {uri} cannot be read ({error}); push it again: dane data push "
                                  f"FILE --uri {uri} --collection t")
    assert push(args) == f"uploaded 57 samples into collection t of {uri}"
    got = as_a_new_run(uri).load()
    assert np.array_equal(got.X, CSVSource(str(files / "t.csv"), target="y", categorical=("kind",),
                                           standardize="none").load().X)


def test_each_worker_fetches_exactly_its_shard(files, tmp_path, monkeypatch):
    """A linear model on data=mongo: worker r's fetched ids are its shard (iid: iid_shards; dirichlet and classes,
    on the labels or on a feature's bins read as a projection: the file source's deal) plus one, the shards are disjoint and cover 1..n, and the built rows equal data=csv's."""
    from dane.data.mongo_store import Store as StoreClass
    from dane.problems.linear_models import LinearModelConfig

    push(push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", str(tmp_path),
                   "--collection", "t"))
    asked: list[list[int]] = []
    by_ids = StoreClass.by_ids
    monkeypatch.setattr(StoreClass, "by_ids", lambda self, name, ids, fields=None: (
        asked.append([int(i) for i in ids]), by_ids(self, name, ids, fields))[1])
    for sharding, skew_on in (("iid", "y"), ("dirichlet", "y"), ("dirichlet", "a"), ("classes", 1)):
        csv = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none", sharding=sharding,
                        skew_on=skew_on, classes_per_worker=4)
        mongo = MongoSource(uri=str(tmp_path), collection="t", sharding=sharding, skew_on=skew_on, classes_per_worker=4)
        by_file, by_id = (LinearModelConfig(data=d, loss="logistic", lam=0.1, seed=4) for d in (csv, mongo))
        asked.clear()
        for rank in range(3):
            a, b = by_file.build(rank, 3), by_id.build(rank, 3)
            assert asked[-1] == (by_file.worker_rows(rank, 3)[0] + 1).tolist()
            assert a.X.equal(b.X) and a.y.equal(b.y) and a.weight == b.weight
            if rank == 0:
                dealt = [[n for n in p.notes if n.startswith(("sharding:", "worker "))] for p in (a, b)]
                assert dealt[0] == dealt[1] and len(dealt[0]) == (0 if sharding == "iid" else 4), dealt
            by_file.release(), by_id.release()
        assert sorted(i for ids in asked for i in ids) == list(range(1, 58))


READ_AGAIN = ("was pushed again since this run first read it (the run's labels and rows would come from two data "
              "sets); run again (nothing was trained)")


@pytest.mark.parametrize("keys, read", [({}, "fetch"), ({"sharding": "dirichlet", "skew_on": "a"}, "column"),
                                        ({"sharding": "column", "client_column": "kind"}, "clients")])
def test_a_linear_models_reads_after_its_labels_are_of_their_push_or_one_line(files, tmp_path, keys, read):
    """A process deals its workers' rows from the labels it read; a push --replace after that made its later reads
    (a worker's rows, a skewed column, the clients) the new push's: one run's workers on two data sets, and a
    worker's labels of the first push beside its rows of the second.  Now each later read is refused in one line,
    and the next run (its check_workers) reads the new push, whose id every worker's shard carries."""
    from dane.problems.linear_models import LinearModelConfig

    uri = str(tmp_path)
    client = ["--client-column", "kind"] if read == "clients" else ["--categorical", "kind"]
    args = (str(files / "t.csv"), "--target", "y", *client, "--uri", uri, "--collection", "t")
    push(push_args(*args))
    as_a_new_run(uri)
    config = LinearModelConfig(data=MongoSource(uri=uri, collection="t", **keys), loss="logistic", lam=0.1)
    config.labels()  # a run's first read
    first = connect(uri).manifest("t")["push_id"]
    if read == "fetch":
        assert config.build(0, 2).data_push == f"collection t of {uri}, push {first[:12]}"
    push(push_args(*args, "--replace"))
    with pytest.raises(DataError) as refused:
        config.build(1, 2)
    assert str(refused.value) == f"collection t of {uri} {READ_AGAIN}"
    assert [entry.name for entry in refused.traceback[-2:]] == [read, "check_push"]
    config.check_workers(2)  # the next run
    now = connect(uri).manifest("t")["push_id"]
    assert now != first and [config.build(rank, 2).data_push for rank in range(2)] == \
        [f"collection t of {uri}, push {now[:12]}"] * 2


def test_launched_workers_that_read_two_pushes_stop_in_one_line(files, tmp_path):
    """Each process of a launched run reads the store itself: a push --replace that ended between two workers'
    reads had worker 0 train on the first push and worker 1 on the second, silently.  check_one_push, over the run's
    communicator (here the simulator's threads, as a launched run's processes would call it), stops every worker
    with one line naming the workers and the push each read; workers on one push go on, their counters untouched."""
    from dane.comm import ThreadGroup
    from dane.loop.worker import check_one_push
    from dane.problems.linear_models import LinearModelConfig

    uri = str(tmp_path)
    args = (str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(push_args(*args))
    config = LinearModelConfig(data=MongoSource(uri=uri, collection="t"), loss="logistic", lam=0.1)
    pushes, shards = [], []
    for rank in range(3):  # as three processes: each run's check_workers and build, a push after worker 0's
        as_a_new_run(uri)
        config.check_workers(3)
        shards.append(config.build(rank, 3))
        config.release()
        pushes.append(connect(uri).manifest("t")["push_id"])
        if rank == 0:
            push(push_args(*args, "--replace"))
    assert pushes[0] != pushes[1] == pushes[2]

    def checked(comm):
        try:
            check_one_push(config, shards[comm.rank], comm)
        except DataError as err:
            return str(err)
        return comm.bytes_sent, comm.calls

    line = ("workers 1, 2 read another push of the data set than worker 0 (worker {rank} read collection t of {uri}, "
            "push {push}): it was pushed again while the workers read it, and they would train on two data sets; run "
            "again (nothing was trained)")
    assert ThreadGroup(3).run(checked) == [line.format(rank=rank, uri=uri, push=pushes[rank][:12]) for rank in range(3)]
    shards[0] = shards[1]
    assert ThreadGroup(3).run(checked) == [(0, 0)] * 3


def pushed_csv(tmp: Path) -> None:
    """{tmp}/mongo_store: the module's files, and t.csv pushed to the store {tmp}/mongo_store/s, collection t."""
    files = write_files(tmp / "mongo_store")
    push(push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", str(files / "s"),
                   "--collection", "t"))


runs.prepare(pushed_csv)
TRAIN = ("problem=logreg", "workers=3", "rounds=4", "quiet=true")
ON = {name: runs.command(f"mongo_store:{name}", *TRAIN, *data, f"out_dir={{tmp}}/mongo_store/{name}")
      for name, data in (("csv", ("data=csv", "data.path={tmp}/mongo_store/t.csv", "data.target=y",
                                  "data.categorical=[kind]", "data.standardize=none")),
                         ("mongo", ("data=mongo", "data.uri={tmp}/mongo_store/s", "data.collection=t")))}


def test_training_on_mongo_gives_the_file_runs_records(commands):
    """dane train on data=mongo and on data=csv (simulator, 3 workers): the same records, bit for bit, time aside."""
    records = {}
    for name, row in ON.items():
        assert commands[row]["rc"] == 0, commands[row]["stderr"]
        records[name] = [{k: v for k, v in json.loads(line).items() if "time" not in k}
                      for line in (commands.tmp / "mongo_store" / name / "rounds.jsonl").read_text().splitlines()]
    assert len(records["csv"]) == 5 and records["csv"] == records["mongo"]


def test_bad_store_lines(files, tmp_path, monkeypatch):
    """A missing store, a missing data set, a bad server URI, a CSV without --target: one line each.  The refused
    server is given up on after 0.1 s, not 3 s: the line is the same, whatever the wait (port 9 refuses at once)."""
    monkeypatch.setattr(mongo_store, "SERVER_WAIT_MS", 100)
    with pytest.raises(DataError, match="no store there"):
        MongoSource(uri=str(tmp_path / "none"), collection="t").manifest()
    push(push_args(str(files / "t.npz"), "--uri", str(tmp_path), "--collection", "t"))
    with pytest.raises(DataError, match=r"data.collection=u: no such data set .* \(it holds: t\)"):
        MongoSource(uri=str(tmp_path), collection="u").manifest()
    with pytest.raises(ConfigError, match="is not a MongoDB URI"):
        server_database("mongodb://host:notaport/db")
    with pytest.raises(DataError, match=r"data.uri=mongodb://127.0.0.1:9/dane: no MongoDB server answers "
                                        r"\(ServerSelectionTimeoutError"):
        MongoSource(uri="mongodb://127.0.0.1:9/dane", collection="t").manifest()  # PyMongo's own client, refused
    with pytest.raises(DataError, match="holds another data set"):
        push(push_args(str(files / "t.svm"), "--uri", str(tmp_path), "--collection", "t"))
    assert push(push_args(str(files / "t.svm"), "--uri", str(tmp_path), "--collection", "t", "--replace")) \
        .startswith("uploaded 41")


def test_server_path_without_a_server(files, tmp_path):
    """What a server URI runs short of a server: its database name, and the reading code on a client object
    that projects server-side (a stand-in over the embedded store that answers find(query, projection))."""
    assert server_database("mongodb://localhost:27017/mydata") == "mydata"
    assert server_database("mongodb://localhost") == "dane"
    push(push_args(str(files / "t.npz"), "--uri", str(tmp_path), "--collection", "t"))
    embedded = connect(str(tmp_path))

    class ServerCollection:  # pymongo's find(filter, projection): only the fields asked, no _id
        def __init__(self, collection):
            self.collection = collection

        def find(self, query, projection=None):
            for doc in self.collection.find(query):
                keep = [k for k, v in (projection or {}).items() if v]
                yield {k: doc[k] for k in keep if k in doc} if projection else doc

    server = Store(db={"t": ServerCollection(embedded.db["t"])}, uri="mongodb://stand-in/dane", embedded=False)
    docs = server.by_ids("t", np.array([3, 1]), ["y", "x0"])
    assert [sorted(d) for d in docs] == [["id", "x0", "y"]] * 2 and [d["id"] for d in docs] == [3, 1]
    expected = NPZSource(str(files / "t.npz")).load()
    assert [d["x0"] for d in docs] == [expected.X[2, 0], expected.X[0, 0]]
    assert os.path.isdir(tmp_path / "dane.t")  # mongita's folder for the collection: on disk, not in memory


def test_pymongos_words_are_quoted_whole_or_cut_at_a_word():
    """A bad URI's line cut PyMongo's hint mid-name ("use urllib.parse.)", at 120 characters), an unanswered server's
    mid-word ("connectTimeoutMS: 20000.0ms, connec)", at 100): the URI's (one sentence) is now quoted whole, the
    server's (its topology follows) cut at the end of a word (`dane.errors.brief`)."""
    from pymongo.errors import ServerSelectionTimeoutError
    from pymongo.uri_parser import parse_uri

    uri = "mongodb://host:notaport/db"
    with pytest.raises(ValueError) as pymongo_said:  # its hint: use urllib.parse.quote_plus
        parse_uri(uri)
    with pytest.raises(ConfigError) as raised:
        server_database(uri)
    assert str(raised.value) == (f"data.uri={uri} is not a MongoDB URI ({pymongo_said.value}); write "
                                 "mongodb://HOST[:PORT]/DATABASE, or a folder for an embedded store")

    class Unanswered:  # PyMongo's error, as a collection of a client that finds no server raises it
        def find_one(self, query):
            raise ServerSelectionTimeoutError(
                "127.0.0.1:1: [Errno 111] Connection refused (configured timeouts: socketTimeoutMS: 20000.0ms, "
                "connectTimeoutMS: 20000.0ms), Timeout: 3.0s, Topology Description: <TopologyDescription id: 1>")

    with pytest.raises(DataError) as raised:
        Store(db={"dane_manifest": Unanswered()}, uri="mongodb://127.0.0.1:1/dane", embedded=False).manifest("t")
    assert str(raised.value) == (
        "data.uri=mongodb://127.0.0.1:1/dane: no MongoDB server answers (ServerSelectionTimeoutError: 127.0.0.1:1: "
        "[Errno 111] Connection refused (configured timeouts: socketTimeoutMS: 20000.0ms, ...); start it, or check "
        "the host and port")


def image_spec(files: Path, uri: Path, *overrides: str):
    """The run spec of a network on the pushed image folder ``files/img`` (5 images, 2 labels)."""
    
    from dane.experiments.config import run_spec

    push(push_args(str(files / "img"), "--uri", str(uri), "--collection", "shapes"))
    return run_spec(composed("problem=digits_mlp", "data@problem.data=mongo", f"problem.data.uri={uri}",
                             "problem.data.collection=shapes", "problem.data.test_fraction=0.4", *overrides))


@pytest.fixture
def fetched(monkeypatch):
    """Every id list MongoSource.images is asked for, in order."""
    asked: list[list[int]] = []
    images = MongoSource.images
    monkeypatch.setattr(MongoSource, "images", lambda self, ids, *pushed: (asked.append([int(i) for i in ids]),
                                                                             images(self, ids, *pushed))[1])
    return asked


def test_network_workers_read_their_shards_images_by_id(files, tmp_path, fetched):
    """problem=digits_mlp on data=mongo: worker r reads the images of its shard's ids and of its test rows, and
    nothing else; the pixels are the files' / 255."""
    from PIL import Image

    from dane.data import shard_indices

    problem = image_spec(files, tmp_path, "workers=2").problem
    data = problem.dataset()
    assert fetched == [[1]] and len(data.train_y) == 3 and len(data.test_y) == 2  # the shape probe alone
    shards = shard_indices(data.train_y, 2, seed=problem.seed)
    test_rows = np.array_split(np.arange(2), 2)
    for rank in range(2):
        fetched.clear()
        built = problem.build(rank, 2)
        assert fetched == [data.train_x.ids[shards[rank].numpy()].tolist(), data.test_x.ids[test_rows[rank]].tolist()]
        files_by_id = [f for label in ("circle", "square") for f in sorted((files / "img" / label).iterdir())]
        expected = np.stack([np.asarray(Image.open(files_by_id[i - 1])) for i in fetched[0]]) / np.float32(255)
        assert np.array_equal(built.train_x.cpu().numpy()[:, 0], expected.astype(np.float32))


def test_a_network_whose_data_set_is_pushed_again_mid_run_is_refused_not_mixed(files, tmp_path):
    """A network reads its images as it goes (its shard's when a worker builds, split learning's minibatch by
    minibatch): a push that leaves the data set as it was (nothing to do) changes nothing, but one that replaces it
    makes the next read one line, not a run trained on two data sets."""
    from PIL import Image

    from dane.data.mongo_source import image_dataset

    data = image_spec(files, tmp_path).problem.dataset()
    before = data.train_x[np.arange(2)]
    first = connect(str(tmp_path)).manifest("shapes")
    assert len(first["fingerprint"]) == 64 and data.notes[0].endswith(  # the push the run read, in its notes
        f", read by id, pushed from {files / 'img'} (sha256 {first['fingerprint'][:16]}, push {first['push_id'][:12]})")
    assert push(push_args(str(files / "img"), "--uri", str(tmp_path), "--collection", "shapes")).endswith("nothing to do")
    assert torch.equal(data.train_x[np.arange(2)], before) and data.test_x.subset(np.arange(1))[0].shape == (1, 9, 7)
    other = tmp_path / "other"
    for label in ("circle", "square"):
        (other / label).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(np.full((9, 7), 40 * k, np.uint8)).save(other / label / f"{k}.png")
    push(push_args(str(other), "--uri", str(tmp_path), "--collection", "shapes", "--replace"))
    line = (f"collection shapes of {tmp_path} was pushed again since this run first read it (its images are read as "
            "the run goes, so the rest of the run would train on other data); start the run again (no resume=) with "
            "overwrite=true or a new out_dir")
    for rows in (data.train_x, data.test_x.subset(np.arange(1)), data.train_x.to(torch.float64)):
        with pytest.raises(DataError) as refused:
            rows[np.arange(1)]
        assert str(refused.value) == line
    again = image_dataset(MongoSource(uri=str(tmp_path), collection="shapes"), seed=0)  # a new run reads the new data
    pixels = again.train_x[np.arange(len(again.train_y))] * 255
    now = connect(str(tmp_path)).manifest("shapes")
    assert now["push_id"] != first["push_id"] and now["fingerprint"] != first["fingerprint"]
    assert again.notes[0].endswith(f"pushed from {other} (sha256 {now['fingerprint'][:16]}, push {now['push_id'][:12]})")
    assert len(again.train_y) + len(again.test_y) == 6 and set(pixels.round().unique().tolist()) <= {0.0, 40.0, 80.0}


def test_launched_network_workers_that_read_two_pushes_stop_in_one_line(files, tmp_path):
    """A launched network's processes each read the labels (and later the images) of the push they found first: a
    push --replace between two workers' first reads had them train on two data sets, each checking only against its
    own push.  Each shard now carries its push, and check_one_push stops every worker with one line."""
    from dane.comm import ThreadGroup
    from dane.loop.worker import check_one_push
    from dane.problems import neural

    config = image_spec(files, tmp_path).problem
    shards, pushes = [], []
    for rank in range(2):  # as two processes: each its own read of the store, a push after worker 0's
        neural._store_dataset.cache_clear()
        shards.append(config.build(rank, 2))
        pushes.append(connect(str(tmp_path)).manifest("shapes")["push_id"])
        push(push_args(str(files / "img"), "--uri", str(tmp_path), "--collection", "shapes", "--replace"))
    assert pushes[0] != pushes[1]

    def checked(comm):
        try:
            check_one_push(config, shards[comm.rank], comm)
        except DataError as err:
            return str(err)

    assert ThreadGroup(2).run(checked) == [
        f"worker 1 read another push of the data set than worker 0 (worker {rank} read collection shapes of "
        f"{tmp_path}, push {pushes[rank][:12]}): it was pushed again while the workers read it, and they would train "
        "on two data sets; run again (nothing was trained)" for rank in range(2)]
    shards[0] = shards[1]
    assert ThreadGroup(2).run(checked) == [None, None]


def test_split_agents_read_each_minibatch_by_id_from_their_list(files, tmp_path, fetched):
    """algorithm=split on data=mongo: building the agents reads no images; agent a's minibatch k reads exactly the
    ids of its assigned list at that batch's positions."""
    from dane.data import shard_indices
    from dane.split.links import SimLink
    from dane.split.training import build_parties

    spec = image_spec(files, tmp_path, "algorithm=split", "workers=2", "algorithm.batch_size=1")
    proto, info = build_parties(spec, {0, 1, 2}, SimLink(spec.comm.cost))
    data = info["data"]
    assert fetched[1:] == [[data.train_x.ids[0]]]  # after the shape probe: the one row that sizes the cut
    shards = shard_indices(data.train_y, 2, seed=spec.problem.seed)
    seen = []
    for a, agent in proto.agents.items():
        assigned = data.train_x.ids[shards[a].numpy()]
        agent.start_epoch()
        for k, batch in enumerate(agent.batches):
            fetched.clear()
            agent.forward(k)
            assert fetched == [assigned[batch.numpy()].tolist()]
            seen += fetched[0]
    assert sorted(seen) == sorted(data.train_x.ids.tolist())


def test_a_push_error_names_the_commands_flags(tmp_path, capsys):
    """The CSV source's checks speak of a run's keys (data.categorical=[gre], data.target); dane data push says its
    own flags."""
    from dane.experiments.data import as_flags, main

    assert as_flags("list it under data.categorical=[gre,rank] to one-hot encode it") == \
        "list it under --categorical gre rank to one-hot encode it"
    assert as_flags("set data.target / data.categorical, data.client_column") == \
        "set --target / --categorical, --client-column"
    text = tmp_path / "text.csv"
    text.write_text("gre,admit\n3.5,1\nabc,0\n")
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(text), "--target", "admit", "--uri", str(tmp_path / "store"), "--collection", "t"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: {text} line 3, column 'gre': 'abc' is not a number; list it under "
                                       "--categorical gre to one-hot encode it, or leave it out with --drop gre (an "
                                       "ID, a name), or clean the file\n")


def test_a_push_leaves_out_the_columns_of_drop_as_a_run_does(files, tmp_path, capsys):
    """--drop is data.drop: the stored rows are the CSV source's with the column left out; a wrong name is the
    source's line in the command's flags, and --drop on a file that is no CSV is refused."""
    from dane.experiments.data import main

    table = tmp_path / "ids.csv"
    table.write_text("student_id,y,a,kind\nS0,1,1.5,p\nS1,0,2.5,q\nS2,1,4.5,p\n")
    uri = str(tmp_path / "store")
    line = push(push_args(str(table), "--target", "y", "--categorical", "kind", "--drop", "student_id", "--uri", uri,
                          "--collection", "ids"))
    assert line == f"uploaded 3 samples into collection ids of {uri}"
    stored = MongoSource(uri=uri, collection="ids").load()
    assert stored.feature_names == ["a", "kind=p", "kind=q"]
    np.testing.assert_array_equal(stored.X, [[1.5, 1, 0], [2.5, 0, 1], [4.5, 1, 0]])
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(table), "--target", "y", "--drop", "id", "--uri", uri, "--collection", "t"])
    assert stopped.value.code == 2  # a user error (experiments/data.py main)
    assert capsys.readouterr().err == (f"error: {table} has no column 'id'; its columns are: student_id, y, a, kind; "
                                       "set --drop to one of them\n")
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(files / "t.npz"), "--drop", "a", "--uri", uri, "--collection", "t"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: dane data push {files / 't.npz'}: --drop is a CSV option, but this "
                                       "file is read as an .npz archive (the format is the suffix: .csv, .npz, any "
                                       "other LIBSVM); push it without --drop, or a CSV table under a name ending in "
                                       ".csv\n")
    # a tab-separated table under another suffix was read as LIBSVM ('... is not LIBSVM'), and --target on a
    # LIBSVM file was ignored: a CSV option on a file that is not read as CSV is refused, before anything is read
    tsv = tmp_path / "ids.tsv"
    tsv.write_text(table.read_text().replace(",", "\t"))
    for options in (["--target", "y", "--delimiter", "\t"], ["--categorical", "kind"]):
        with pytest.raises(SystemExit) as stopped:
            main(["push", str(tsv), *options, "--uri", uri, "--collection", "tsv"])
        assert stopped.value.code == 2
        assert capsys.readouterr().err == (f"error: dane data push {tsv}: {options[0]} is a CSV option, but this file "
                                           "is read as LIBSVM (the format is the suffix: .csv, .npz, any other "
                                           f"LIBSVM); push it without {' '.join(o for o in options if o[:2] == '--')}"
                                           ", or a CSV table under a name ending in .csv\n")


def test_a_relative_store_is_the_working_folders_for_the_push_and_the_run(files, tmp_path, monkeypatch):
    """--uri stores/demo run in a folder went to the checkout's stores/demo (resolve_dir, data_dir's rule) while the
    run's results/ went to the working folder; now the push and a run given the same data.uri both use the working
    folder's, in a checkout as installed."""
    monkeypatch.chdir(tmp_path)
    args = push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", "stores/demo",
                     "--collection", "t")
    assert push(args) == f"uploaded 57 samples into collection t of {tmp_path / 'stores' / 'demo'}"
    source = MongoSource(uri="stores/demo", collection="t")
    assert source.location == str(tmp_path / "stores" / "demo")
    expected = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none").load()
    got = source.load()
    assert np.array_equal(got.X, expected.X) and np.array_equal(got.y, expected.y)
    assert MongoSource(uri=str(tmp_path / "stores" / "demo"), collection="t").location == source.location
    monkeypatch.chdir(tmp_path / "stores")  # elsewhere, the same relative uri is another folder: none there
    with pytest.raises(DataError) as raised:
        MongoSource(uri="stores/demo", collection="t").load()
    assert str(raised.value) == (f"data.uri={tmp_path / 'stores' / 'stores' / 'demo'}: no store there "
                                 f"({tmp_path / 'stores' / 'stores' / 'demo'} is not a folder); push one first: "
                                 f"dane data push FILE --uri {tmp_path / 'stores' / 'stores' / 'demo'} --collection NAME")


def test_a_push_to_a_uri_that_is_a_file_is_one_line(tmp_path, capsys):
    """--uri naming a file (the data file itself, say) is no store's folder: one line, nothing written (was mongita's
    FileExistsError traceback)."""
    from dane.experiments.data import main

    table = tmp_path / "t.csv"
    table.write_text("a,y\n1,0\n2,1\n")
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(table), "--target", "y", "--uri", str(table), "--collection", "t"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: --uri={table} is a file, not a store's folder; give a folder (made if "
                                       "absent) or a mongodb:// URI\n")
    assert table.read_text() == "a,y\n1,0\n2,1\n"


def store_files(folder: Path) -> dict[str, bytes]:
    """Every file of an embedded store, by path: what a refused push must leave as it was."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_push_of_a_file_that_is_no_image_uploads_nothing(files, tmp_path, capsys):
    """An image folder holding a file Pillow cannot read (text named .png, a cut PNG), or images of two shapes: one
    line naming the file, exit 2, and the store as it was, before a byte is uploaded (was "uploaded 6 samples", then
    PIL's UnidentifiedImageError in the run)."""
    import shutil

    from PIL import Image

    from dane.experiments.data import main

    folder, store = tmp_path / "img", tmp_path / "store"
    shutil.copytree(files / "img", folder)
    push(push_args(str(files / "t.npz"), "--uri", str(store), "--collection", "t"))
    before = store_files(store)
    bad = folder / "square" / "2.png"
    png = (folder / "circle" / "0.png").read_bytes()
    fix = "then push again (nothing was uploaded)"
    for write, line in (
            (lambda: bad.write_text("not an image\n"),
             f"{bad} is not an image Pillow can read (not an image file Pillow knows); replace it with an image or "
             f"remove it, {fix}"),
            (lambda: bad.write_bytes(png[:len(png) // 2]),
             f"{bad} is not an image Pillow can read (OSError: image file is truncated); replace it with an image or "
             f"remove it, {fix}"),
            (lambda: Image.fromarray(np.zeros((5, 5), np.uint8)).save(bad),
             f"{bad} has shape (5, 5), not (9, 7) as {folder / 'circle' / '0.png'} (2 shapes in {folder}): a run "
             f"stacks the images, so they must be one size; resize them, {fix}")):
        write()
        for uri in (store, tmp_path / "fresh"):
            with pytest.raises(SystemExit) as stopped:
                main(["push", str(folder), "--uri", str(uri), "--collection", "shapes"])
            assert stopped.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
        assert store_files(store) == before and not (tmp_path / "fresh").exists()
    (folder / "circle" / "1.png").write_text("")
    bad.write_text("not an image\n")
    with pytest.raises(DataError, match=rf"^{folder / 'circle' / '1.png'} is not an image Pillow can read \(not an "
                                        rf"image file Pillow knows\), nor are 1 more of the 6 files in {folder}; "
                                        "replace them with images or remove them, then push again"):
        push(push_args(str(folder), "--uri", str(store), "--collection", "shapes"))


def test_a_stored_image_no_run_can_decode_is_one_line(files, tmp_path):
    """A data set holding a file that is no image (pushed before a push checked them): the run's line names the
    sample and the push that repairs it, not PIL's traceback."""
    import shutil

    from dane.data.mongo_push import push_images

    folder, uri = tmp_path / "img", tmp_path / "store"
    shutil.copytree(files / "img", folder)
    (folder / "square" / "1.png").write_text("not an image\n")
    push_images(connect(str(uri), create=True), "shapes", folder, checked=True, print_fn=lambda line: None)
    source = MongoSource(uri=str(uri), collection="shapes")
    assert source.images([1, 4])[0].shape == (2, 9, 7)
    with pytest.raises(DataError) as raised:
        source.images([1, 5])
    assert str(raised.value) == (f"collection shapes of {uri}: sample 5 (square/1.png) is not an image Pillow can read "
                                 "(not an image file Pillow knows); replace that file in the folder and push it again: "
                                 f"dane data push FOLDER --uri {uri} --collection shapes --replace")


@pytest.mark.parametrize("keep, line", [
    ({"circle": 1, "square": 2}, "class circle has only 1 sample (samples per class: circle=1, square=2)"),
    ({"circle": 1}, "class circle has only 1 sample (samples per class: circle=1)"),
])
def test_an_image_class_of_one_is_one_line(files, tmp_path, keep, line):
    """A pushed image folder whose stratified hold-out cannot be made (a class of one image, one image in all): one
    DataError line naming the data set, the class counts and the fix (was scikit-learn's ValueError)."""
    import shutil

    from dane.data.mongo_source import image_dataset

    folder, uri = tmp_path / "img", tmp_path / "store"
    for label, count in keep.items():
        (folder / label).mkdir(parents=True)
        for k in range(count):
            shutil.copy(files / "img" / label / f"{k}.png", folder / label)
    push(push_args(str(folder), "--uri", str(uri), "--collection", "few"))
    with pytest.raises(DataError) as raised:
        image_dataset(MongoSource(uri=str(uri), collection="few"), seed=0)
    assert str(raised.value) == (f"collection few of {uri}: {line}; a stratified hold-out needs at least 2 of each "
                                 "class: add samples of it, or remove the class, then push the folder again: dane data "
                                 f"push FOLDER --uri {uri} --collection few --replace")


@pytest.mark.parametrize("name, uri, line", [
    ("a$b", "{tmp}", "--collection 'a$b': '$' (character 2) is not allowed in a collection name; choose another name "
                     "(letters, digits, '_' and '-'), e.g. --collection a_b"),
    ("a b", "{tmp}", "--collection 'a b': ' ' (character 2) is not allowed in an embedded store's collection name; "
                     "choose another name (letters, digits, '_' and '-'), e.g. --collection a_b"),
    ("x\\y", "{tmp}", "--collection 'x\\\\y': '\\\\' (character 2) is not allowed in an embedded store's collection "
                      "name; choose another name (letters, digits, '_' and '-'), e.g. --collection x_y"),
    ("dane_manifest", "{tmp}", "--collection 'dane_manifest': dane_manifest is the store's list of data sets; choose "
                               "another name (letters, digits, '_' and '-')"),
    ("system.t", "mongodb://localhost/dane", "--collection 'system.t': a collection name cannot start with 'system.'; "
                                             "choose another name (letters, digits, '_' and '-'), e.g. --collection "
                                             "system_t"),
])
def test_a_bad_collection_name_is_one_line_naming_the_character(files, tmp_path, capsys, name, uri, line):
    """--collection a store cannot hold: push's own flag and the character at fault (was "data.collection must name
    a data set pushed with dane data push, got 'a$b'", or mongita's InvalidName traceback); nothing written."""
    from dane.experiments.data import main

    with pytest.raises(SystemExit) as stopped:
        main(["push", str(files / "t.npz"), "--uri", uri.format(tmp=tmp_path / "store"), "--collection", name])
    assert stopped.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
    assert not (tmp_path / "store").exists()


def test_a_push_names_npz_keys_as_its_own_flags(files, tmp_path, capsys):
    """An archive without the array X: the line names --x-key, which push now has (was "set data.x_key"); with it the
    archive is pushed, and read back as data=npz data.x_key reads it. A run's bad name still names data.collection
    and the character."""
    from dane.experiments.data import as_flags, main

    archive = tmp_path / "a.npz"
    np.savez(archive, A=np.arange(6.0).reshape(3, 2), y=np.array([0.0, 1.0, 0.0]))
    uri = str(tmp_path / "store")
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(archive), "--uri", uri, "--collection", "a"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: {archive} has no array 'X' (--x-key); its keys are: A, y; set --x-key "
                                       "to one of them, or write it with dane.data.files.save_npz(path, X, y)\n")
    assert push(push_args(str(archive), "--uri", uri, "--collection", "a", "--x-key", "A")).startswith("uploaded 3")
    assert np.array_equal(MongoSource(uri=uri, collection="a").load().X, NPZSource(str(archive), x_key="A").load().X)
    assert as_flags("check data.path; set data.y_key or data.collection") == \
        "check the path given; set --y-key or --collection"
    with pytest.raises(ConfigError) as raised:
        MongoSource(uri=uri, collection="a$b")
    assert str(raised.value) == ("data.collection='a$b': '$' (character 2) is not allowed in a collection name; give "
                                 "the name of a data set pushed with dane data push ... --collection NAME")


def test_a_complete_upload_not_marked_finished_is_named_by_its_state(files, tmp_path):
    """Every sample stored but the manifest still ``uploading`` (a push stopped before its last step): the run
    refuses it (it was "short: 57 of 57 samples (uploading)", short though none is missing); the next push finishes it
    and the run reads the rows. One sample lost as well: short, as before."""
    uri = str(tmp_path)
    args = push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t")
    push(args)
    connect(uri).db["dane_manifest"].update_one({"_id": "t"}, {"$set": {"state": "uploading"}})
    with pytest.raises(DataError) as refused:
        as_a_new_run(uri).manifest()
    assert str(refused.value) == (f"collection t of {uri} holds all 57 samples, but its upload was not marked finished "
                                  "(state uploading: the push stopped before its last step); push it again to finish "
                                  "it: dane data push ... --collection t")
    connect(uri).db["t"].delete_one({"id": 57})
    with pytest.raises(DataError, match=r"^collection t of .* is short: 56 of 57 samples \(uploading\); push it again"):
        as_a_new_run(uri).manifest()
    assert push(args) == (f"completed (found 56 of 57 samples from an interrupted push) 57 samples into collection t "
                          f"of {uri}")
    assert as_a_new_run(uri).manifest()["state"] == "complete"


def test_a_push_into_a_store_another_push_writes_is_refused_and_a_dead_ones_lock_taken_over(files, tmp_path, capsys):
    """Two pushes into one embedded store at once: the second dropped the first's data set in flight as unreadable
    ("cannot be read back (InvalidBSON); dropping it"), crashed in mongita (FileNotFoundError), or "completed" what
    nothing had interrupted, and a run then read a store cut mid-write.  Now a push holds the store's lock throughout:
    another push into it (into any data set) is refused in one line naming the holder, exit 2, nothing written, and a
    run on it says to wait for that push (not "push it again", though the data set is short while that push writes);
    a dead push's lock is taken over."""
    import socket

    from dane.experiments.data import main
    from dane.records.lock import LOCK_FILE, take_lock
    from helpers import unused_pid

    uri = str(tmp_path)
    push(push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri, "--collection", "t"))
    lock = take_lock(tmp_path, mongo_store.PUSHING)  # as a push in flight holds it: this process, alive
    holder = f"{socket.gethostname()} pid {os.getpid()}"
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(files / "t.npz"), "--uri", uri, "--collection", "other"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: store {uri} is being written by another push ({holder}); wait for "
                                       f"that push to end, then push again (nothing was written; remove {lock} if no "
                                       "push uses the store)\n")
    assert [doc["_id"] for doc in connect(uri).find("dane_manifest", {}, ["_id"])] == ["t"]
    waiting = (f"store {uri} is being written by a push ({holder}); wait for that push to end, then run again (remove "
               f"{lock} if no push uses the store)")
    with pytest.raises(DataError) as refused:
        as_a_new_run(uri).labels()
    assert str(refused.value) == waiting
    connect(uri).db["t"].delete_one({"id": 57})  # short, as while a push writes it
    connect(uri).db["dane_manifest"].update_one({"_id": "t"}, {"$set": {"state": "uploading"}})
    with pytest.raises(DataError) as refused:
        as_a_new_run(uri).manifest()
    assert str(refused.value) == waiting

    lock.write_text(f"{socket.gethostname()} {unused_pid()}")  # its push was killed
    assert push(push_args(str(files / "t.npz"), "--uri", uri, "--collection", "other")) == \
        f"uploaded 33 samples into collection other of {uri}"
    assert not (tmp_path / LOCK_FILE).exists()  # released when the push ended
    assert np.array_equal(as_a_new_run(uri, "other").load().X, NPZSource(str(files / "t.npz")).load().X)


def test_a_push_waits_for_a_run_reading_the_store_and_a_run_reading_while_a_push_writes_is_refused(files, tmp_path,
                                                                                                   monkeypatch):
    """A run that was reading an embedded store when a push began read what the push was writing: here a fetch
    paused mid-read while a push --replace ran to its end, then read samples 1..57 of a data set that held 33.  A
    read now holds the store's lock shared (`mongo_store.reading`), a push exclusively (`pushing`): the push says it
    waits for the run's read, writes nothing until that read ends, then pushes; the read returns the rows it began
    on.  A read (an image minibatch, which does not look for a push's lock itself) while a push holds the store is
    refused with the line that says to wait for it.  (Where the lock regresses, held exclusively by every read or
    never released, a read or the push waits for ever: the test fails after 5 s instead, its threads daemons.)"""
    import threading

    from dane.data.mongo_push import push_table
    from helpers import fails_after

    with fails_after(5, "a read or a push of the store"):
        uri = str(tmp_path)
        push(push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "--uri", uri,
                       "--collection", "t"))
        csv = CSVSource(str(files / "t.csv"), target="y", categorical=("kind",), standardize="none").load()
        npz = NPZSource(str(files / "t.npz")).load()
        run = as_a_new_run(uri)
        ids = run.labels()[0]
        in_read, go, moved = threading.Event(), threading.Event(), threading.Event()
        by_ids = Store.by_ids

        def paused(self, *args):
            in_read.set()
            go.wait(60)
            return by_ids(self, *args)

        monkeypatch.setattr(Store, "by_ids", paused)
        got, said = {}, []

        def reader():
            try:
                got["table"] = run.fetch(ids)
            except Exception as err:  # noqa: BLE001 - asserted below
                got["error"] = err

        def say(line):
            said.append(line)
            moved.set()

        def pusher():
            said.append(push_table(connect(uri), "t", npz, print_fn=say, fingerprint_of="npz", replace=True))
            moved.set()

        reading = threading.Thread(target=reader, daemon=True)
        reading.start()
        in_read.wait()
        pushing = threading.Thread(target=pusher, daemon=True)
        pushing.start()
        moved.wait()  # the push's first word: that it waits, or (before) its end
        assert said == [f"push: a run is reading store {uri}; waiting for its read to end"]
        assert connect(uri).db["dane_manifest"].find_one({"_id": "t"})["source"] == csv.name  # nothing written yet
        go.set()
        reading.join()
        pushing.join()
        assert "error" not in got, got
        assert np.array_equal(got["table"].X, csv.X) and np.array_equal(got["table"].y, csv.y)
        assert said[1] == f"uploaded 33 samples into collection t of {uri}"
        monkeypatch.undo()
        assert np.array_equal(as_a_new_run(uri).load().X, npz.X)

        push(push_args(str(files / "img"), "--uri", uri, "--collection", "img"))
        run = as_a_new_run(uri, "img")
        run.images(np.array([1]))
        with mongo_store.pushing(connect(uri)):
            with pytest.raises(DataError) as refused:
                run.images(np.array([2]))
        assert str(refused.value) == (f"store {uri} is being written by a push ({socket.gethostname()} pid "
                                      f"{os.getpid()}); wait for that push to end, then run again (remove "
                                      f"{tmp_path / '.lock'} if no push uses the store)")
        assert run.images(np.array([2]))[1].tolist() == [0.0]


def test_a_read_holds_the_store_shared_and_a_push_exclusive_and_a_read_beside_a_push_is_refused(tmp_path):
    """`mongo_store.reading` and `pushing` on the folder's ``flock`` (`dane.records.lock.flocked`), in one thread: a
    read holds it shared (a second read would not wait, a push would), a push exclusively; a read that finds it held
    while a push's lock is live is refused with `push_refusal`'s line at once.  (A timer ends the other hold after
    2 s where the read waits instead: no hang.)"""
    import fcntl
    import threading
    from types import SimpleNamespace

    uri = str(tmp_path)
    with mongo_store.reading(uri):
        assert flock_waits(tmp_path, fcntl.LOCK_EX) and not flock_waits(tmp_path, fcntl.LOCK_SH)
    with mongo_store.pushing(SimpleNamespace(embedded=True, uri=uri), waiting=pytest.fail):
        assert flock_waits(tmp_path, fcntl.LOCK_SH)
    assert not flock_waits(tmp_path, fcntl.LOCK_EX) and not (tmp_path / ".lock").exists()
    (tmp_path / ".lock").write_text(f"{socket.gethostname()} {os.getpid()}")  # a live push's lock: this process
    push = os.open(tmp_path, os.O_RDONLY)
    ends = threading.Timer(2.0, fcntl.flock, (push, fcntl.LOCK_UN))
    try:
        fcntl.flock(push, fcntl.LOCK_EX)
        ends.start()
        with pytest.raises(DataError) as refused, mongo_store.reading(uri):
            pass
    finally:
        ends.cancel()
        ends.join()
        os.close(push)
    assert str(refused.value) == (f"store {uri} is being written by a push ({socket.gethostname()} pid {os.getpid()}); "
                                  f"wait for that push to end, then run again (remove {tmp_path / '.lock'} if no push "
                                  "uses the store)")


def test_softmax_by_id_counts_the_stored_data_sets_classes_on_a_shard_that_lacks_some(files, tmp_path):
    """A run by id on the store (labels from the (id, y) projection, rows fetched by id) counts the data set's classes,
    as a file source's run counts its table's: t.svm's labels are 0, 1 and 2, dealt one class a worker, and every
    worker's softmax has 3 classes (a worker counting its own labels had 1, and the first allreduce stopped)."""
    from dane.problems.linear_models import LinearModelConfig

    push(push_args(str(files / "t.svm"), "--uri", str(tmp_path), "--collection", "t"))
    config = LinearModelConfig(data=MongoSource(uri=str(tmp_path), collection="t", sharding="classes",
                                                classes_per_worker=1), loss="softmax", name="softmax", seed=0)
    assert config.by_id
    shards = [config.build(rank, 3) for rank in range(3)]
    assert sorted(np.unique(s.y.numpy()).size for s in shards) == [1, 1, 1]  # one label each
    assert [s.classes for s in shards] == [3, 3, 3] and len({s.dim for s in shards}) == 1


def test_a_runs_collection_name_is_refused_by_the_pushs_rule(files, tmp_path, capsys):
    """data.collection=a.b on an embedded store was looked up and refused with "push it first: dane data push ...
    --collection a.b", a push that push itself refuses ('.' is not allowed there).  The run now checks the name by the
    push's rule for the store (`name_problem`): refused before the store is read; a server's MongoDB names pass."""
    from dane.experiments.data import main

    uri = str(tmp_path / "store")
    with pytest.raises(ConfigError) as raised:
        MongoSource(uri=uri, collection="a.b")
    problem = "'.' (character 2) is not allowed in an embedded store's collection name"
    assert str(raised.value) == (f"data.collection='a.b': {problem}; give the name of a data set pushed with dane data "
                                 "push ... --collection NAME")
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(files / "t.npz"), "--uri", uri, "--collection", "a.b"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: --collection 'a.b': {problem}; choose another name (letters, digits, "
                                       "'_' and '-'), e.g. --collection a_b\n")
    assert MongoSource(uri="mongodb://localhost/dane", collection="a.b").collection == "a.b"
    assert not (tmp_path / "store").exists()
