"""data=mongo with data.sharding=column (issue 47, items 1 and 3): clients from a column of a pushed table.

`dane data push --client-column NAME` stores each row's client in the field ``client``; a run with
``data=mongo data.sharding=column data.client_column=NAME`` deals the ``(id, client)`` projection.
Each test compares with the file source's ``data.sharding=column`` on the file pushed: the same
shards, rows, notes and training records; and the rows the store is asked for are each worker's own.
Everything runs on the embedded engine (mongita's disk store in a temporary folder).
"""
from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mongita", reason="the embedded store needs mongita: pip install mongita (make setup)")

from dane.data.files import CSVSource, LibSVMSource, NPZSource  # noqa: E402
from dane.data.mongo_source import MongoSource  # noqa: E402
from dane.errors import ConfigError, DataError, UserError  # noqa: E402
from dane.experiments.data import parser, push  # noqa: E402
from dane.problems.linear_models import LinearModelConfig  # noqa: E402
import runs  # noqa: E402

SITES = ["b", "a", "c", "a", "b", "b", "c", "a", "b", "a", "c", "b"]  # 12 rows x 4: the CSV's site of row i
#: the rows of each site, in sorted order (a, b, c), counted by hand from SITES repeated 4 times
HAND = {"a": [1, 3, 7, 9], "b": [0, 4, 5, 8, 11], "c": [2, 6, 10]}


CSV_SITES = ("--target", "y", "--categorical", "kind", "--client-column", "site")


def push_args(*argv: str) -> Namespace:
    return parser().parse_args(["push", *argv])


def write_files(tmp: Path) -> Path:
    """The module's files in ``tmp``: t.csv (48 rows, sites `SITES`), t.npz (30, groups), t.svm (21, qid)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    rows = ["y,a,site,b,kind"] + [f"{(i * 7) % 3 == 0:d},{rng.normal():.17g},{SITES[i % 12]},{rng.integers(0, 9)},"
                                  f"{'pq'[i % 5 == 0]}" for i in range(48)]
    (tmp / "t.csv").write_text("\n".join(rows) + "\n")
    np.savez(tmp / "t.npz", X=rng.standard_normal((30, 3)), y=(np.arange(30) % 2).astype(float),
             groups=np.array([[10, 2, 7][i % 3] if i % 4 else 2 for i in range(30)]))
    (tmp / "t.svm").write_text("".join(f"{i % 2} qid:{[3, 1, 2][i % 3]} 1:{i}.5 4:{-i}\n" for i in range(21)))
    return tmp


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return write_files(tmp_path_factory.mktemp("clients"))


SOURCES = {  # kind: (push options, the file source, the client column, workers)
    "csv": (["--target", "y", "--categorical", "kind"], lambda f, **k: CSVSource(
        str(f), target="y", categorical=("kind",), standardize="none", **k), "site", 3),
    "npz": ([], lambda f, **k: NPZSource(str(f), **k), "groups", 3),
    "svm": ([], lambda f, **k: LibSVMSource(str(f), **k), "qid", 3),
}


@pytest.mark.parametrize("kind", list(SOURCES))
def test_store_deals_the_clients_as_the_file_source(files, tmp_path, kind, monkeypatch):
    """Shards, rows and notes equal the file source's ``sharding=column``; the column is no feature field; each
    worker asks the store for its own ids alone; the run reads the (id, client) projection, not the rows."""
    from dane.data.mongo_store import Store

    extra, make, column, m = SOURCES[kind]
    path = files / f"t.{kind}"
    assert push(push_args(str(path), "--uri", str(tmp_path), "--collection", "t", "--client-column", column, *extra)) \
        .startswith("uploaded")
    keys = {"sharding": "column", "client_column": column}
    file_source = make(path, **keys)
    store_source = MongoSource(uri=str(tmp_path), collection="t", **keys)
    manifest = store_source.labels()[2]
    assert manifest["client_column"] == column and manifest["client_field"] == "client"
    table = file_source.load()
    assert manifest["columns"] == (table.feature_names if kind == "csv" else manifest["columns"])
    assert "site" not in manifest["columns"] and manifest["d"] == table.d
    assert store_source.clients().tolist() == table.clients.tolist()
    if kind == "csv":
        assert table.clients.tolist() == SITES * 4
    asked: list[list[int]] = []
    projections: list[list[str]] = []
    by_ids, find = Store.by_ids, Store.find
    monkeypatch.setattr(Store, "by_ids", lambda self, name, ids, fields=None: (
        asked.append([int(i) for i in ids]), by_ids(self, name, ids, fields))[1])
    monkeypatch.setattr(Store, "find", lambda self, name, query, fields=None: (
        projections.append(sorted(fields or [])), find(self, name, query, fields))[1])
    by_file, by_id = (LinearModelConfig(data=d, loss="logistic", lam=0.1, seed=2) for d in (file_source, store_source))
    for rank in range(m):
        a, b = by_file.build(rank, m), by_id.build(rank, m)
        rows = by_file.worker_rows(rank, m)[0]
        assert asked[-1] == (rows + 1).tolist() and by_id.worker_rows(rank, m)[0].tolist() == rows.tolist()
        dense = [p.X.to_dense() if p.X.layout != torch.strided else p.X for p in (a, b)]  # LIBSVM: sparse CSR
        assert dense[0].equal(dense[1]) and a.y.equal(b.y) and a.weight == b.weight
        if rank == 0:
            dealt = [[n for n in p.notes if n.startswith(("sharding:", "worker "))] for p in (a, b)]
            assert dealt[0] == dealt[1] and len(dealt[0]) == m + 1, dealt
    assert ["client", "id"] in projections  # the clients came from their own projection
    assert sorted(i for ids in asked for i in ids) == list(range(1, table.n + 1))
    if kind == "csv":  # by hand: the rows of each site, in sorted order of the sites
        hand = [sorted(r + 12 * k for k in range(4) for r in HAND[s]) for s in "abc"]
        assert [by_id.worker_rows(r, 3)[0].tolist() for r in range(3)] == hand


def pushed_sites(tmp: Path) -> None:
    """{tmp}/mongo_clients: the module's files, and t.csv pushed with its sites to {tmp}/mongo_clients/s, as t."""
    files = write_files(tmp / "mongo_clients")
    push(push_args(str(files / "t.csv"), *CSV_SITES, "--uri", str(files / "s"), "--collection", "t"))


runs.prepare(pushed_sites)
TRAIN = ("problem=logreg", "workers=3", "rounds=4", "quiet=true", "data.sharding=column", "data.client_column=site")
BY_SITE = {name: runs.command(f"mongo_clients:{name}", *TRAIN, *data, f"out_dir={{tmp}}/mongo_clients/{name}")
           for name, data in (("csv", ("data=csv", "data.path={tmp}/mongo_clients/t.csv", "data.target=y",
                                       "data.categorical=[kind]", "data.standardize=none")),
                              ("mongo", ("data=mongo", "data.uri={tmp}/mongo_clients/s", "data.collection=t")))}


def test_training_on_the_store_by_clients_gives_the_csv_runs_records(commands):
    """dane train, simulator, 3 clients (sites): data=mongo and data=csv, both data.sharding=column, give the same
    records bit for bit (time aside), with every client's notes."""
    records, notes = {}, {}
    for name, row in BY_SITE.items():
        assert commands[row]["rc"] == 0, commands[row]["stderr"]
        out = commands.tmp / "mongo_clients" / name
        records[name] = [{k: v for k, v in json.loads(line).items() if "time" not in k}
                         for line in (out / "rounds.jsonl").read_text().splitlines()]
        summary = json.loads((out / "summary.json").read_text())
        notes[name] = [n for n in summary["notes"] if n.startswith(("sharding:", "worker "))]
    assert len(records["csv"]) == 5 and records["csv"] == records["mongo"]
    assert notes["csv"] == notes["mongo"] and len(notes["csv"]) == 4
    assert notes["csv"][1:] == [f"worker {w} (site={s}): {4 * len(HAND[s])} rows; "
                                f"{notes['csv'][1 + w].split('; ')[1]}" for w, s in enumerate("abc")]


def test_a_store_without_the_client_column_says_how_to_push_it(files, tmp_path):
    """Pushed without --client-column (or with another column), asked for one: one line naming the push to make.
    An image folder takes no --client-column; a network on an image data set refuses sharding=column."""
    push(push_args(str(files / "t.csv"), "--target", "y", "--categorical", "kind", "site", "--uri", str(tmp_path),
                   "--collection", "t"))  # the sites one-hot features
    plain = LinearModelConfig(data=MongoSource(uri=str(tmp_path), collection="t", sharding="column",
                                               client_column="site"), loss="logistic")
    with pytest.raises(DataError, match=r"^data.client_column=site: data set t in .* was pushed without a client "
                                        r"column; push it with them: dane data push FILE --client-column site "):
        plain.check_workers(3)
    with pytest.raises(DataError) as refused:  # another fingerprint: --replace is needed
        push(push_args(str(files / "t.csv"), *CSV_SITES, "--uri", str(tmp_path), "--collection", "t"))
    # the same file pushed with other options: it said 'holds another data set (csv:t.csv)', the file being pushed
    assert str(refused.value) == (f"collection t of {tmp_path} holds an earlier push of csv:t.csv whose rows or "
                                  "options differ from this one's; push into another --collection, or add --replace "
                                  "to drop it and upload this one")
    assert push(push_args(str(files / "t.csv"), *CSV_SITES, "--uri", str(tmp_path), "--collection", "t",
                          "--replace")).startswith("uploaded 48")
    push(push_args(str(files / "t.csv"), *CSV_SITES, "--uri", str(tmp_path), "--collection", "u"))
    other = MongoSource(uri=str(tmp_path), collection="u", sharding="column", client_column="kind")
    with pytest.raises(DataError, match="data set u in .* holds the clients of column 'site'; push it with them"):
        other.clients()
    with pytest.raises(ConfigError, match="has 3 distinct values \\(clients\\), one per worker, but workers=2"):
        LinearModelConfig(data=MongoSource(uri=str(tmp_path), collection="u", sharding="column",
                                           client_column="site"), loss="logistic").check_workers(2)
    (tmp_path / "img" / "one").mkdir(parents=True)
    with pytest.raises(UserError, match="--client-column names a column of a table; an image folder has none"):
        push(push_args(str(tmp_path / "img"), "--client-column", "x", "--uri", str(tmp_path), "--collection", "i"))


def test_a_client_missing_is_refused_before_the_push_and_named_by_sample_in_a_store(tmp_path, capsys):
    """An .npz whose client array holds NaN at row 5 was stored ("uploaded 12 samples") and refused only by the run,
    in a line naming no store and no push. Now the push refuses it before it touches the store (no folder made);
    a data set pushed so before is refused by the run in one line naming the store, the sample id (row 5 is
    sample 6) and the push that replaces it."""
    from dane.data.mongo_push import push_table
    from dane.data.mongo_store import connect
    from dane.data.table import Table
    from dane.experiments.data import main

    sites = np.array([7.0, 2, 2, 10, 10, np.nan, 3, 3, 7, np.nan, 2, 3])
    path = tmp_path / "nan.npz"
    np.savez(path, X=np.arange(24.0).reshape(12, 2), y=(np.arange(12) % 2).astype(float), site=sites)
    store = tmp_path / "store"
    with pytest.raises(SystemExit) as stopped:
        main(["push", str(path), "--client-column", "site", "--uri", str(store), "--collection", "nanx"])
    assert stopped.value.code == 2 and not store.exists()
    assert capsys.readouterr().err.strip() == (
        f"error: {path}: 'site' (--client-column) is nan at row 5 (0-based, site[5]; 2 of 12 rows have no client); "
        "every row needs a client: fill them in (e.g. -1 or 'unknown') and save the archive again, or drop those "
        "rows from X, y and 'site'")
    # as an earlier push stored it: the rows with their clients, NaN included
    table = Table(X=np.ones((12, 2)), y=np.arange(12) % 2.0, name="nan.npz", notes=[], clients=sites)
    push_table(connect(str(store), create=True), "nanx", table, client_column="site")
    config = LinearModelConfig(data=MongoSource(uri=str(store), collection="nanx", sharding="column",
                                                client_column="site"), loss="logistic")
    with pytest.raises(DataError) as refused:
        config.check_workers(4)
    assert str(refused.value) == (
        f"collection nanx of {store}: sample 6 has no client (data.client_column=site is nan; 2 of 12 samples); "
        "every row needs a client: fill the column in, then push the file again: dane data push FILE "
        f"--client-column site --uri {store} --collection nanx --replace")
