"""data.sharding=column (issue 47): one client per distinct value of a column of the CSV, the .npz or LIBSVM's qid.

Each test compares with row sets counted by hand: the shards are the rows of each value in sorted
order, the column is no feature, the notes give every client's value, rows and label histogram,
and client sampling draws among these clients.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

import dane
from dane.data.files import CSVSource, LibSVMSource, NPZSource, save_npz
from dane.data.sharding import column_shards
from dane.errors import ConfigError, DataError
from dane.problems.linear_models import LinearModelConfig
from dane.sampling import ClientSampler

#: 10 rows: a label, two numeric features, a categorical one, and the client column
COUNTRIES = ["US", "Peru", "US", "India", "Peru", "US", "US", "India", "US", "Peru"]
LABELS = [1, 0, 0, 1, 1, 0, 1, 1, 0, 0]
#: the rows of each country, in sorted order of the values (India, Peru, US), counted by hand
ROWS = {"India": [3, 7], "Peru": [1, 4, 9], "US": [0, 2, 5, 6, 8]}


def csv_file(tmp_path):
    lines = ["age,hours,edu,country,income"]
    for i, (country, label) in enumerate(zip(COUNTRIES, LABELS)):
        lines.append(f"{20 + 3 * i},{35 + i % 4},{'BA' if i % 3 else 'HS'},{country},{label}")
    path = tmp_path / "people.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def dealt(source, m: int, loss: str = "logistic", name: str = "logreg") -> tuple[list[np.ndarray], list[str]]:
    config = LinearModelConfig(data=source, loss=loss, name=name, seed=0)
    rows = [config.worker_rows(rank, m)[0] for rank in range(m)]
    return rows, config.worker_rows(0, m)[1]


def test_csv_clients_are_the_rows_of_each_value_and_the_column_is_no_feature(tmp_path):
    source = CSVSource(str(csv_file(tmp_path)), target="income", categorical=("edu",), sharding="column",
                       client_column="country")
    rows, notes = dealt(source, 3)
    assert [r.tolist() for r in rows] == list(ROWS.values())
    table = source.load()
    assert table.feature_names == ["age", "hours", "edu=BA", "edu=HS"]  # no country column, nor its one-hot
    assert table.clients.tolist() == COUNTRIES
    plain = CSVSource(str(csv_file(tmp_path)), target="income", categorical=("edu", "country"))
    assert plain.load().X.shape[1] == table.X.shape[1] + 3  # the same file with country one-hot: 3 more columns
    assert np.array_equal(plain.load().X[:, :4], table.X)  # the other features unchanged
    assert notes == [
        "sharding: column (data.client_column=country: one client per distinct value, in sorted order; histograms "
        "of labels): 3 workers, rows 2, 3, 5",
        "worker 0 (country=India): 2 rows; 1: 2",
        "worker 1 (country=Peru): 3 rows; -1: 2, 1: 1",
        "worker 2 (country=US): 5 rows; -1: 3, 1: 2",
    ]
    built = LinearModelConfig(data=source, loss="logistic", name="logreg").build(2, 3)
    assert built.dim == 4 and len(built.y) == 5  # d = the 4 features; US's 5 rows


def test_npz_clients_from_a_key_of_the_archive_numbers_in_numeric_order(tmp_path):
    X = np.arange(20.0).reshape(10, 2)
    groups = np.array([10, 2, 10, 2, 7, 7, 7, 10, 2, 2])  # numerically 2 < 7 < 10 (as text "10" < "2")
    np.savez(tmp_path / "g.npz", X=X, y=np.array(LABELS, dtype=float), groups=groups)
    source = NPZSource(str(tmp_path / "g.npz"), sharding="column", client_column="groups")
    rows, notes = dealt(source, 3)
    assert [r.tolist() for r in rows] == [[1, 3, 8, 9], [4, 5, 6], [0, 2, 7]]
    assert source.load().X.shape == (10, 2)  # the clients are their own array, not a column of X
    assert [n.split(":")[0] for n in notes[1:]] == ["worker 0 (groups=2)", "worker 1 (groups=7)",
                                                    "worker 2 (groups=10)"]
    assert notes[1] == "worker 0 (groups=2): 4 rows; -1: 3, 1: 1"
    # strings saved as a NumPy string array: sorted as text
    np.savez(tmp_path / "s.npz", X=X, y=np.array(LABELS, dtype=float), site=np.array(COUNTRIES))
    rows, _ = dealt(NPZSource(str(tmp_path / "s.npz"), sharding="column", client_column="site"), 3)
    assert [r.tolist() for r in rows] == list(ROWS.values())


@pytest.mark.parametrize("sparse", [False, True])
def test_save_npz_writes_the_client_column_data_npz_reads(tmp_path, sparse):
    """save_npz took X and y only, so the page's data=npz ... data.client_column=groups needed np.savez by hand;
    ``columns=`` stores more arrays as given, read back as data.client_column reads them."""
    X = np.arange(20.0).reshape(10, 2)
    groups = np.array([10, 2, 10, 2, 7, 7, 7, 10, 2, 2])
    path = dane.save_npz(tmp_path / "g", sp.csr_matrix(X) if sparse else X, LABELS,
                         columns={"groups": groups, "site": COUNTRIES})
    with np.load(path) as archive:
        assert archive["groups"].dtype == groups.dtype and archive["groups"].tolist() == groups.tolist()
        assert archive["site"].tolist() == COUNTRIES
    rows, notes = dealt(NPZSource(str(path), sharding="column", client_column="groups"), 3)
    assert [r.tolist() for r in rows] == [[1, 3, 8, 9], [4, 5, 6], [0, 2, 7]]
    assert notes[1] == "worker 0 (groups=2): 4 rows; -1: 3, 1: 1"
    rows, _ = dealt(NPZSource(str(path), sharding="column", client_column="site"), 3)
    assert [r.tolist() for r in rows] == list(ROWS.values())
    table = NPZSource(str(path)).load()
    assert (table.X.toarray() if sparse else table.X).tolist() == X.tolist()


def test_save_npz_refuses_a_column_it_cannot_store_as_named(tmp_path):
    keys = "X_data, X_indices, X_indptr, X_shape, y"
    lines = {
        "y": "save_npz: column 'y' is a key X or y is stored under (X, y); give the column another name (or X and y "
             "other keys: x_key=, y_key=)",
        "X": "save_npz: column 'X' is a key X or y is stored under (X, y); give the column another name (or X and y "
             "other keys: x_key=, y_key=)",
        "short": "save_npz: column 'short' has shape (3,); it must hold one value per row, 4 values",
        "objects": "save_npz: column 'objects' has dtype object; give integers, reals or strings (an object array is "
                   "not stored: the archive is read without pickle)",
    }
    values = {"y": [0, 1, 0, 1], "X": [0, 1, 0, 1], "short": [0, 1, 0], "objects": np.array([None, 1, "a", 2.0])}
    for name, line in lines.items():
        with pytest.raises(DataError) as refused:
            save_npz(tmp_path / "r.npz", np.eye(4), [0, 1, 0, 1], columns={name: values[name]})
        assert str(refused.value) == line
    with pytest.raises(DataError) as refused:  # sparse X: its four arrays' keys are taken too
        save_npz(tmp_path / "r.npz", sp.eye(4), [0, 1, 0, 1], columns={"X_indptr": [0, 1, 0, 1]})
    assert str(refused.value) == (f"save_npz: column 'X_indptr' is a key X or y is stored under ({keys}); give the "
                                  "column another name (or X and y other keys: x_key=, y_key=)")
    assert not (tmp_path / "r.npz").exists()


def test_libsvm_clients_are_the_qids_which_are_no_feature(tmp_path):
    qids = [4, 4, 1, 1, 1, 9, 4, 9, 1, 4]
    lines = [f"{y} qid:{q} 1:{i}.5 3:{i % 3}" for i, (y, q) in enumerate(zip(LABELS, qids))]
    path = tmp_path / "q.svm"
    path.write_text("\n".join(lines) + "\n")
    source = LibSVMSource(str(path), sharding="column", client_column="qid")
    rows, notes = dealt(source, 3)
    assert [r.tolist() for r in rows] == [[2, 3, 4, 8], [0, 1, 6, 9], [5, 7]]
    table = source.load()
    X, y = load_svmlight_file(str(path))  # scikit-learn's reading without qid: the same matrix
    assert table.X.shape == (10, 3) and (table.X != X).nnz == 0
    assert notes[0].endswith("3 workers, rows 4, 4, 2") and notes[3] == "worker 2 (qid=9): 2 rows; -1: 1, 1: 1"
    # qid is read only when asked: the same file with iid sharding reads as before
    assert LibSVMSource(str(path)).load().clients is None


@pytest.mark.parametrize("qid, why", [("abc", "qid:abc is not an integer"), ("nan", "qid:nan is not an integer"),
                                      ("1.5", "qid:1.5 is not an integer"), ("", "qid: has no value")])
def test_a_qid_that_is_no_integer_is_named_with_its_line(tmp_path, qid, why):
    """scikit-learn reads qid:<n> as an integer: qid:abc was "... is not a LIBSVM file (invalid literal for int() with
    base 10: b'abc'); each line is '<label> <index>:<value> ...'", no line, nor that qid takes an integer.  The line
    is named, with the format qid needs; read without qid (iid sharding), the file is read as before."""
    path = tmp_path / "q.svm"
    path.write_text(f"1 qid:4 1:0.5\n-1 qid:{qid} 2:0.25\n1 qid:zz 1:2\n")
    with pytest.raises(DataError) as refused:
        LibSVMSource(str(path), sharding="column", client_column="qid").load()
    assert str(refused.value) == (f"{path} line 2 is not LIBSVM ({why}: '-1 qid:{qid} 2:0.25'); with "
                                  "data.client_column=qid each line is '<label> qid:<n> <index>:<value> ...', <n> an "
                                  "integer (the line's client); fix the line")
    assert LibSVMSource(str(path)).load().n == 3


def test_a_qid_is_checked_only_where_it_is_read_and_after_the_label(tmp_path):
    """The qid check of a line that scikit-learn could not parse applies where the run reads qid: read without it, a
    qid:abc on line 1 is skipped and line 2's bad pair is named; read with it, a line whose label is no number is
    named for its label, in the plain format, before its qid."""
    fmt = "each line is '<label> <index>:<value> ...' with increasing indices; fix the line"
    plain, both = tmp_path / "a.svm", tmp_path / "b.svm"
    plain.write_text("1 qid:abc 1:0.5\n-1 2:x\n")
    both.write_text("1 qid:4 1:0.5\nyes qid:abc 2:0.25\n")
    with pytest.raises(DataError) as refused:
        LibSVMSource(str(plain)).load()
    assert str(refused.value) == f"{plain} line 2 is not LIBSVM ('2:x' is not index:value: '-1 2:x'); {fmt}"
    with pytest.raises(DataError) as refused:
        LibSVMSource(str(both), sharding="column", client_column="qid").load()
    assert str(refused.value) == (f"{both} line 2 is not LIBSVM (the label is not a number: 'yes qid:abc 2:0.25'); "
                                  f"{fmt}")


def test_a_regression_target_gets_its_quantile_bins_per_client(tmp_path):
    path = csv_file(tmp_path)
    source = CSVSource(str(path), target="age", categorical=("edu",), sharding="column", client_column="country",
                       bins=2)
    _, notes = dealt(source, 3, loss="squared", name="ridge")
    # ages 20, 23, ..., 47: bins of 5 rows, the lower half rows 0-4; India = rows 3, 7 -> one each
    assert notes[0].startswith("sharding: column (data.client_column=country: one client per distinct value, in "
                               "sorted order; histograms of 2 quantile bins of y (edges 20, 33.5, 47))")
    assert notes[1:] == ["worker 0 (country=India): 2 rows; 0: 1, 1: 1", "worker 1 (country=Peru): 3 rows; 0: 2, 1: 1",
                         "worker 2 (country=US): 5 rows; 0: 2, 1: 3"]


def test_column_shards_orders_values_and_refuses_another_worker_count():
    shards, labels = column_shards(np.array(["b", "a", "10", "b"]), 3)
    assert labels == ["10", "a", "b"] and [s.tolist() for s in shards] == [[2], [1], [0, 3]]
    shards, labels = column_shards(["2", "10", "2", "1"], 3)  # every value a number: numeric order
    assert labels == ["1", "2", "10"] and [s.tolist() for s in shards] == [[3], [0, 2], [1]]
    shards, labels = column_shards(np.array([3.0, 1.5, 3.0]), 2)
    assert labels == ["1.5", "3"] and all(s.dtype == np.int64 for s in shards)
    with pytest.raises(ConfigError, match=r"^data.client_column=country has 2 distinct values \(clients\), one per "
                                          r"worker, but workers=3; set workers=2 \(under horovodrun or torchrun: "
                                          r"launch 2 processes\)$"):
        column_shards(["x", "y", "x"], 3, name="data.client_column=country")


def test_client_sampling_draws_among_the_column_clients_with_their_sizes(tmp_path, monkeypatch):
    drawn, weights = [], []
    draw = ClientSampler.draw

    def spy(self):
        weights.append(None if self.weights is None else self.weights.tolist())
        chosen = draw(self)
        drawn.append(chosen.tolist())
        return chosen

    monkeypatch.setattr(ClientSampler, "draw", spy)
    source = CSVSource(str(csv_file(tmp_path)), target="income", categorical=("edu",), sharding="column",
                       client_column="country")
    problem = dane.problems.LogReg(data=source, lam=1e-2)
    result = dane.fit(problem, "fednl", variant="pp", workers=3, rounds=6, clients_per_round=2, sampling="size",
                      seed=1)  # FedNL-PP: the method that keeps sampling=size (`dane.sampling`)
    assert [r["clients"] for r in result.records] == [2] * 7
    assert weights == [[2.0, 3.0, 5.0]] * 18  # the clients' sizes (India, Peru, US), as each of the 3 workers holds
    rounds = drawn[::3]  # each round every worker draws the same set from the shared generator
    assert drawn == [s for s in rounds for _ in range(3)] and len(rounds) == 6
    assert all(len(s) == 2 and set(s) <= {0, 1, 2} for s in rounds)
    assert {c for s in rounds for c in s} == {0, 1, 2}  # over six rounds every client takes part
    with pytest.raises(ConfigError, match="data.client_column=country has 3 distinct values"):
        dane.fit(problem, "fedavg", workers=4, rounds=1)


def test_the_keys_are_checked_where_they_are_read(tmp_path):
    path = str(csv_file(tmp_path))
    with pytest.raises(ConfigError, match="^data.client_column=income is the label"):
        CSVSource(path, target="income", sharding="column", client_column="income")
    with pytest.raises(ConfigError, match="^data.client_column=edu is also in data.categorical"):
        CSVSource(path, target="income", categorical=("edu",), sharding="column", client_column="edu")
    with pytest.raises(ConfigError, match="^data.client_column=y is the archive's X or y"):
        NPZSource(path, sharding="column", client_column="y")
    with pytest.raises(ConfigError, match=r"^data.sharding=column needs data.client_column=NAME, which for LIBSVM "
                                          r"is qid"):
        LibSVMSource(path, sharding="column")
    with pytest.raises(ConfigError, match="^data.sharding=column with per-worker parts"):
        CSVSource("part-{rank}.csv", target="income", sharding="column", client_column="country")
    save_npz(tmp_path / "two.npz", np.eye(2), [0.0, 1.0])
    with pytest.raises(DataError, match="has no array 'site' \\(data.client_column\\); its keys are: X, y; set "
                                        "data.client_column to one of them, or add the clients' array to the archive "
                                        "\\(dane.save_npz\\(path, X, y, columns=\\{'site': clients\\}\\)\\)$"):
        NPZSource(str(tmp_path / "two.npz"), sharding="column", client_column="site").load()


@pytest.mark.parametrize("site, shown, row", [
    (np.array([7.0, 2.0, 2.0, 10.0, 10.0, np.nan, 3.0, 3.0]), "nan", 5),
    (np.array([7.0, 2.0, np.inf, 10.0, 10.0, 3.0, 3.0, 1.0]), "inf", 2),
    (np.array(["a", "b", "", "a", "b", "a", "b", "a"]), "''", 2),
    (np.array(["a", "b", "a", "b", "a", "b", "a", " NaN "]), "' NaN '", 7),
    (np.array([b"a", b"b", b"a", b"na", b"a", b"?", b"a", b"b"]), "'na'", 3),
])
def test_an_npz_row_without_a_client_is_one_line_naming_the_file_and_row(tmp_path, site, shown, row):
    """A NaN or inf float, or a text the CSV reader reads as missing ('', NA, NaN, ?, any case, stripped), is no
    client: refused when the archive is read (a run, or `dane data push` before it stores anything), naming the
    file, the row as the arrays index it and the count, as the CSV reader refuses an empty cell. It was stored and
    dealt (''), or refused only when dealt, by a line naming no file."""
    path = tmp_path / "m.npz"
    np.savez(path, X=np.arange(16.0).reshape(8, 2), y=np.array(LABELS[:8], dtype=float), site=site)
    missing = 2 if shown == "'na'" else 1
    with pytest.raises(DataError) as refused:
        NPZSource(str(path), sharding="column", client_column="site").load()
    assert str(refused.value) == (
        f"{path}: 'site' (data.client_column) is {shown} at row {row} (0-based, site[{row}]; {missing} of 8 rows have "
        "no client); every row needs a client: fill them in (e.g. -1 or 'unknown') and save the archive again, or "
        "drop those rows from X, y and 'site'")
    # the same values in a CSV's client column: refused by the same rule (the floats as the text they print as)
    cells = ["" if isinstance(v, float) and np.isinf(v) else str(v.decode() if isinstance(v, bytes) else v)
             for v in site.tolist()]
    csv = tmp_path / "m.csv"
    csv.write_text("x,site,y\n" + "".join(f"{i},{c},{LABELS[i]}\n" for i, c in enumerate(cells)))
    with pytest.raises(DataError, match=f"^{csv} line {row + 2}, column 'site' \\(data.client_column\\): value "
                                        "missing"):
        CSVSource(str(csv), target="y", sharding="column", client_column="site").load()


def test_text_that_is_a_value_is_a_client_and_column_shards_refuses_the_missing():
    """'inf' and '0' are text, clients as the CSV reader reads them; column_shards refuses '' and 'nan', which it
    dealt as a client of its own (labels ['', '1', '2'])."""
    shards, labels = column_shards(np.array(["inf", "0", "inf"]), 2)
    assert labels == ["0", "inf"] and [s.tolist() for s in shards] == [[1], [0, 2]]
    for values, shown, row in ((np.array(["1", "", "2", "1"]), "''", 1), (["1", "2", "nan", "1"], "'nan'", 2),
                               (np.array([1.0, 2.0, 1.0, np.nan]), "nan", 3)):
        with pytest.raises(DataError, match=f"^data.client_column=site is {shown} at row {row} \\(0-based\\); every "
                                            "row needs a client, fill it in$"):
            column_shards(values, 3, name="data.client_column=site")


def test_the_two_lines_about_column_sources_name_the_same_sources():
    """Both refusals of sharding=column on a source without a client column name data=mongo too (one said
    data=csv|libsvm|npz)."""
    from dane.data.sharding import ShardingKeys

    with pytest.raises(ConfigError) as column:
        ShardingKeys(sharding="column", client_column="site").check_sharding()
    with pytest.raises(ConfigError) as other:
        ShardingKeys(sharding="natural").check_sharding()
    assert str(column.value) == ("data.sharding=column reads each row's client from a column of a data file, which "
                                 "this data set has not; use data=csv|npz|libsvm|mongo with data.client_column=NAME")
    assert "(column needs a file with a client column: data=csv|npz|libsvm|mongo and data.client_column)" \
        in str(other.value)
