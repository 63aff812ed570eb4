"""Bring-your-own-data sources read exactly what was written, and refuse bad input in one line.

Every file is written here into tmp_path; only the admissions cross-check reads the
shared data folder, and it skips cleanly when the file is absent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue
from sklearn.datasets import dump_svmlight_file

from dane.data.files import (
    BuiltinSource,
    CSVSource,
    LibSVMSource,
    NPZSource,
    check_labels,
    resolve,
    resolve_dir,
    save_npz,
)
from dane.layout import CHECKOUT as REPO_ROOT  # tests run in a checkout
from dane.data.labels import two_class_note
from dane.errors import ConfigError, DataError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CONF_DATA = REPO_ROOT / "conf" / "data"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def one_line(err: pytest.ExceptionInfo) -> str:
    """The message, checked to be a single line (the entry point prints it as is)."""
    message = str(err.value)
    assert "\n" not in message, message
    return message


def sparse_problem(n: int = 200, d: int = 20_000, density: float = 0.005, seed: int = 0):
    """A realistic sparse design, with values of 6 decimals so that LIBSVM text holds them exactly."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=seed, data_rvs=rng.standard_normal)
    X.data = np.round(X.data, 6)
    X.eliminate_zeros()
    return X, rng.choice([-1.0, 1.0], size=n)


# ---------------------------------------------------------------- CSV: exact matrices
MIXED_CSV = "y,a,color,b\n1,1.0,red,10\n0,,blue,20\n1,3.0,red,30\n0,5.0,green,40\n"


def test_csv_imputes_the_mean_and_one_hot_encodes_in_sorted_order(tmp_path):
    path = write(tmp_path, "mixed.csv", MIXED_CSV)
    table = CSVSource(str(path), target="y", categorical=("color",), standardize=False).load()
    expected = np.array([
        # a (row 2 imputed: mean of 1, 3, 5)  blue green red   b
        [1.0, 0.0, 0.0, 1.0, 10.0],
        [3.0, 1.0, 0.0, 0.0, 20.0],
        [3.0, 0.0, 0.0, 1.0, 30.0],
        [5.0, 0.0, 1.0, 0.0, 40.0],
    ])
    np.testing.assert_array_equal(table.X, expected)
    np.testing.assert_array_equal(table.y, [1.0, 0.0, 1.0, 0.0])
    assert table.X.dtype == np.float64 and table.y.dtype == np.float64
    assert table.feature_names == ["a", "color=blue", "color=green", "color=red", "b"]
    assert table.name == "csv:mixed.csv"
    assert any("imputed 1 missing value(s) in 'a' with the column mean 3" in n for n in table.notes)
    assert any("'color' -> 3 columns (blue, green, red)" in n for n in table.notes)


def test_csv_standardizes_numeric_columns_only(tmp_path):
    path = write(tmp_path, "mixed.csv", MIXED_CSV)
    raw = CSVSource(str(path), target="y", categorical=("color",), standardize=False).load().X
    table = CSVSource(str(path), target="y", categorical=("color",)).load()
    numeric = [0, 4]
    np.testing.assert_allclose(table.X[:, numeric].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(table.X[:, numeric].std(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(table.X[:, 4], (raw[:, 4] - 25.0) / np.sqrt(125.0), atol=1e-15)
    assert abs(table.X[1, 0]) < 1e-15  # the imputed cell sits at the mean
    np.testing.assert_array_equal(table.X[:, 1:4], raw[:, 1:4])  # one-hot columns untouched
    assert any("standardized 2 numeric column(s)" in n for n in table.notes)


def test_csv_constant_column_is_centred_to_exact_zero(tmp_path):
    # Seven copies of 0.1 have a std of 1.4e-17 from rounding; dividing by it would make noise.
    rows = "".join(f"{i % 2},{i},0.1\n" for i in range(7))
    table = CSVSource(str(write(tmp_path, "c.csv", "y,x,c\n" + rows)), target="y").load()
    np.testing.assert_array_equal(table.X[:, 1], np.zeros(7))
    assert any("not scaled: c" in n for n in table.notes)


def test_csv_median_imputation_and_nan_inf_cells_are_missing(tmp_path):
    path = write(tmp_path, "m.csv", "y,a\n0,1\n1,NA\n0,2\n1,inf\n0,10\n1,?\n0,NaN\n")
    table = CSVSource(str(path), target="y", impute="median", standardize=False).load()
    np.testing.assert_array_equal(table.X[:, 0], [1, 2, 2, 2, 10, 2, 2])
    assert any("imputed 4 missing value(s) in 'a' with the column median 2" in n for n in table.notes)


def test_csv_semicolon_delimiter(tmp_path):
    path = write(tmp_path, "s.csv", "y;a;b\n1;2,5;3\n")  # the comma inside a cell is not a delimiter here
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y", delimiter=";", standardize=False).load()
    assert "line 2, column 'a': '2,5' is not a number" in one_line(err)
    write(tmp_path, "s.csv", "y;a;b\n1;2.5;3\n0;4;5\n")
    table = CSVSource(str(path), target="y", delimiter=";", standardize=False).load()
    np.testing.assert_array_equal(table.X, [[2.5, 3.0], [4.0, 5.0]])


def test_csv_tab_delimiter_as_typed(tmp_path):
    """data.delimiter='\\t' (conf/data/csv.yaml's example) arrives from a shell as backslash and t, which was refused
    as two characters; it is the tab, as a real tab is."""
    path = write(tmp_path, "t.tsv", "y\ta\tb\n1\t2.5\t3\n0\t4\t5\n")
    for typed in ("\\t", "\t"):
        table = CSVSource(str(path), target="y", delimiter=typed, standardize=False).load()
        np.testing.assert_array_equal(table.X, [[2.5, 3.0], [4.0, 5.0]])
    with pytest.raises(ConfigError, match=r"^data.delimiter must be one character \(e.g. ';', or '\\t' for a "
                                          r"tab\), got '\\\\n\\\\t'$"):
        CSVSource(str(path), target="y", delimiter="\\n\\t")


# ---------------------------------------------------------------- LIBSVM and NPZ: exact round trips
def test_libsvm_reads_back_the_sparse_matrix_written(tmp_path):
    X, y = sparse_problem()
    dump_svmlight_file(X, y, str(tmp_path / "big.svm"), zero_based=True)
    table = LibSVMSource(str(tmp_path / "big.svm"), n_features=20_000, zero_based=True).load()
    assert isinstance(table.X, sp.csr_matrix) and table.X.shape == (200, 20_000)
    assert table.X.nnz == X.nnz and (table.X != X).nnz == 0
    np.testing.assert_array_equal(table.y, y)
    assert table.X.dtype == np.float64


def test_libsvm_without_n_features_takes_the_largest_index(tmp_path):
    path = write(tmp_path, "small.svm", "1 1:0.5 4:2\n# a comment\n\n-1 2:1.5\n")
    table = LibSVMSource(str(path)).load()  # auto: no index 0, so 1-based
    np.testing.assert_array_equal(table.X.toarray(), [[0.5, 0, 0, 2], [0, 1.5, 0, 0]])
    np.testing.assert_array_equal(table.y, [1.0, -1.0])


@pytest.mark.parametrize("sparse", [False, True])
def test_npz_round_trip(tmp_path, sparse):
    X, y = sparse_problem(n=30, d=50, density=0.2, seed=3)
    X = X if sparse else X.toarray()
    path = save_npz(tmp_path / "data", X, y)
    assert path.name == "data.npz"
    table = NPZSource(str(path)).load()
    assert isinstance(table.X, sp.csr_matrix) == sparse
    np.testing.assert_array_equal(table.X.toarray() if sparse else table.X, X.toarray() if sparse else X)
    np.testing.assert_array_equal(table.y, y)


# ---------------------------------------------------------------- presharded parts
def test_libsvm_parts_give_each_worker_its_rows_and_the_total(tmp_path):
    X, y = sparse_problem()
    cuts = [0, 50, 120, 200]  # unequal parts
    for r in range(3):
        rows = slice(cuts[r], cuts[r + 1])
        dump_svmlight_file(X[rows], y[rows], str(tmp_path / f"part-{r}.svm"), zero_based=True)
    source = LibSVMSource("part-{rank}.svm", n_features=20_000, zero_based=True, data_dir=str(tmp_path))
    assert source.presharded
    for r in range(3):
        table, total = source.load_part(r, 3)
        assert total == 200 and table.X.shape == (cuts[r + 1] - cuts[r], 20_000)
        assert (table.X != X[cuts[r]:cuts[r + 1]]).nnz == 0
        np.testing.assert_array_equal(table.y, y[cuts[r]:cuts[r + 1]])
        assert f"holds {cuts[r + 1] - cuts[r]} of the N=200 rows" in table.notes[-1]


def test_csv_and_npz_parts(tmp_path):
    full = np.arange(24, dtype=np.float64).reshape(8, 3)  # label column first
    cuts = [0, 3, 8]
    for r in range(2):
        rows = full[cuts[r]:cuts[r + 1]]
        body = "".join(",".join(f"{v:g}" for v in row) + "\n" for row in rows)
        write(tmp_path, f"part-{r}.csv", "y,a,b\n" + body + "\n")  # a trailing blank line is not a row
        save_npz(tmp_path / f"part-{r}.npz", rows[:, 1:], rows[:, 0])
    csv_source = CSVSource(str(tmp_path / "part-{rank}.csv"), target="y", standardize=False)
    npz_source = NPZSource(str(tmp_path / "part-{rank}.npz"))
    for r in range(2):
        for source in (csv_source, npz_source):
            table, total = source.load_part(r, 2)
            assert total == 8
            np.testing.assert_array_equal(table.X, full[cuts[r]:cuts[r + 1], 1:])
            np.testing.assert_array_equal(table.y, full[cuts[r]:cuts[r + 1], 0])


def test_part_count_must_equal_the_workers(tmp_path):
    for r in range(3):
        write(tmp_path, f"part-{r}.csv", f"y,a\n{r},1\n")
    source = CSVSource(str(tmp_path / "part-{rank}.csv"), target="y", standardize=False)
    with pytest.raises(DataError) as err:
        source.load_part(0, 2)
    assert "part-2.csv exists but the run launched only 2 workers" in one_line(err)
    assert "launch 3 workers" in str(err.value)
    with pytest.raises(DataError) as err:
        source.load_part(0, 4)
    assert "part-3.csv not found" in one_line(err) and "launch as many workers" in str(err.value)


def test_parts_with_different_widths(tmp_path):
    write(tmp_path, "part-0.csv", "y,a,b\n1,2,3\n")
    write(tmp_path, "part-1.csv", "y,a\n1,2\n")
    source = CSVSource(str(tmp_path / "part-{rank}.csv"), target="y", standardize=False)
    with pytest.raises(DataError) as err:
        source.load_part(1, 2)
    message = one_line(err)
    assert "d mismatch between files" in message and "part-0.csv (d=2)" in message and "part-1.csv (d=1)" in message


def test_parts_with_reordered_columns(tmp_path):
    write(tmp_path, "part-0.csv", "y,a,b\n1,2,3\n")
    write(tmp_path, "part-1.csv", "y,b,a\n1,3,2\n")
    with pytest.raises(DataError) as err:
        CSVSource(str(tmp_path / "part-{rank}.csv"), target="y", standardize=False).load_part(0, 2)
    assert "columns differ between files" in one_line(err)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: LibSVMSource("p-{rank}.svm", zero_based=True), "data.n_features is required"),
        (lambda: LibSVMSource("p-{rank}.svm", n_features=5), "set data.zero_based=true"),
        (lambda: CSVSource("p-{rank}.csv", target="y"), "standardize when you write the parts"),
        (lambda: CSVSource("p-{rank}.csv", target="y", standardize=False, categorical=["c"]), "one-hot encode when"),
        (lambda: CSVSource("x.csv", target="y", impute="zero"), "data.impute must be one of mean|median|error"),
        (lambda: CSVSource("x.csv", target="y", categorical=["y"]), "remove it from data.categorical"),
        (lambda: BuiltinSource("cifar10"), "data.dataset must be one of"),
    ],
)
def test_config_errors(build, words):
    with pytest.raises(ConfigError) as err:
        build()
    assert words in one_line(err)


# ---------------------------------------------------------------- bad input: one line each
def test_missing_file_lists_every_place_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        CSVSource("nope.csv", target="y", data_dir=str(tmp_path / "data")).load()
    message = one_line(err)
    assert f"tried {tmp_path / 'data' / 'nope.csv'}, {tmp_path / 'nope.csv'};" in message
    assert "set data.path=/absolute/path or data_dir=" in message


def test_relative_paths_resolve_from_data_dir_then_cwd(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    in_data = write(tmp_path / "data", "x.csv", "")
    in_cwd = write(tmp_path, "y.csv", "")
    monkeypatch.chdir(tmp_path)
    assert resolve("x.csv", str(tmp_path / "data")) == in_data
    assert resolve("y.csv", str(tmp_path / "data")) == tmp_path / "y.csv" == in_cwd
    assert resolve(str(in_data), None) == in_data
    assert resolve_dir("some/folder") == REPO_ROOT / "some" / "folder"  # not the cwd
    assert resolve_dir(None) is None


@pytest.mark.parametrize(
    "text, kwargs, words",
    [
        ("y,a\n1,2\n", {"target": "label"}, "has no column 'label'; its columns are: y, a"),
        ("y,a\n1,2\n", {"target": "y", "categorical": ["c"]}, "has no column 'c'; its columns are: y, a"),
        ("y;a\n1;2\n", {"target": "a"}, "its columns are: y;a (one column: is data.delimiter=',' right?)"),
        ("y,a\n1,2\n0,3\n1,abc\n", {"target": "y"}, "line 4, column 'a': 'abc' is not a number; list it under "
                                                    "data.categorical=[a] to one-hot encode it, or leave it out "
                                                    "with data.drop=[a] (an ID, a name), or clean the file"),
        ("y,a\n1,2\n,3\n", {"target": "y"}, "line 3: the label (column 'y') is missing"),
        ("y,a\nyes,2\n", {"target": "y"}, "line 2, the label column 'y': 'yes' is not a number"),
        ("y,a\n1,2\n1,\n", {"target": "y", "impute": "error"},
         "line 3, column 'a': value missing ('') and data.impute=error"),
        ("y,a\n1,2\n1,2,3\n", {"target": "y"}, "line 3 has 3 cells but the header has 2 columns"),
        ("y,a\n1,NA\n", {"target": "y"}, "column 'a' has no values at all"),
        ("", {"target": "y"}, "is empty; a CSV needs a header row"),
        ("\n\n", {"target": "y"}, "is empty; a CSV needs a header row"),
        ("y,a\n", {"target": "y"}, "has a header (y, a) but no data rows"),
        ("1,2\n3,4\n", {"target": "y"}, "looks like data, not a header"),
        ("y,a,a\n1,2,3\n", {"target": "y"}, "names column(s) a twice"),
        ("y\n1\n", {"target": "y"}, "has only the label column 'y'"),
    ],
)
def test_bad_csv(tmp_path, text, kwargs, words):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(DataError) as err:
        CSVSource(str(path), standardize=False, **kwargs).load()
    message = one_line(err)
    assert words in message and str(path) in message


def test_binary_file_given_as_csv(tmp_path):
    path = tmp_path / "image.csv"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y").load()
    assert "is not UTF-8 text (byte 0x80 cannot be decoded)" in one_line(err)
    path.write_bytes(b"y,a\n1,\x00\n")  # valid UTF-8 with a NUL byte: a bad cell, named
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y").load()
    assert "line 2, column 'a': '\\x00' is not a number" in one_line(err)


@pytest.mark.parametrize(
    "text, kwargs, words",
    [
        ("1 1:2\n0 2:3 3:x\n", {}, "line 2 is not LIBSVM ('3:x' is not index:value: '0 2:3 3:x')"),
        ("1 1:2\nabc 2:3\n", {}, "line 2 is not LIBSVM (the label is not a number"),
        ("1 3:2 1:1\n", {}, "line 1 is not LIBSVM (indices do not increase"),
        ("1 1:2 9:1\n", {"n_features": 5}, "needs 9 features but data.n_features=5; raise data.n_features"),
        ("1 0:2\n", {"zero_based": False}, "has feature index 0 but data.zero_based=false"),
        ("1 1:nan\n", {}, "holds 1 non-finite values (nan/inf)"),
        ("# only a comment\n", {}, "holds no rows"),
    ],
)
def test_bad_libsvm(tmp_path, text, kwargs, words):
    path = write(tmp_path, "bad.svm", text)
    with pytest.raises(DataError) as err:
        LibSVMSource(str(path), **kwargs).load()
    assert words in one_line(err)


def test_binary_file_given_as_libsvm(tmp_path):
    path = tmp_path / "noise.svm"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    with pytest.raises(DataError) as err:
        LibSVMSource(str(path)).load()
    assert "is not LIBSVM" in one_line(err)


def test_bad_npz(tmp_path):
    np.savez(tmp_path / "keys.npz", features=np.ones((2, 2)), y=np.ones(2))
    with pytest.raises(DataError) as err:
        NPZSource(str(tmp_path / "keys.npz")).load()
    assert "has no array 'X' (data.x_key); its keys are: features, y; set data.x_key" in one_line(err)
    cases = {
        "short.npz": (dict(X=np.ones((3, 2)), y=np.ones(2)), "'X' has 3 rows but 'y' has 2 labels"),
        "flat.npz": (dict(X=np.ones(3), y=np.ones(3)), "'X' has shape (3,); it must be 2-D"),
        "nan.npz": (dict(X=np.array([[1.0, np.nan]]), y=np.ones(1)), "1 non-finite values (first at row 0, column 1)"),
        "text.npz": (dict(X=np.array([["a"]]), y=np.ones(1)), "'X' has dtype <U1; it must be real numbers"),
        "bad_csr.npz": (dict(X_data=np.ones(2), X_indices=np.array([0, 7]), X_indptr=np.array([0, 1, 2]),
                             X_shape=np.array([2, 3]), y=np.ones(2)), "do not form a CSR matrix"),
    }
    for name, (arrays, words) in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(DataError) as err:
            NPZSource(str(tmp_path / name)).load()
        assert words in one_line(err), name
    write(tmp_path, "text.npz", "not a zip")
    with pytest.raises(DataError) as err:
        NPZSource(str(tmp_path / "text.npz")).load()
    assert "is not an .npz archive: it is a text file" in one_line(err)  # never numpy's advice on allow_pickle
    (tmp_path / "bytes.npz").write_bytes(bytes(range(1, 256)))
    with pytest.raises(DataError, match="bytes.npz is not an .npz archive: it is not a zip archive; write it with"):
        NPZSource(str(tmp_path / "bytes.npz")).load()



def test_text_labels_are_one_line_with_the_fix_when_saved_and_when_read(tmp_path):
    """save_npz(path, X, ["yes", "no", ...]) raised NumPy's bare "could not convert string to float", and a run on an
    archive holding them said "'y' has dtype <U3; it must be real numbers", without a fix: both name the labels and
    the fix (numbers, e.g. 0/1), and save_npz writes nothing; so does text in X."""
    labels = ["yes", "no", "yes", "maybe", "no"]
    fix = "map them to numbers, e.g. 0/1 (0..K-1 for K classes: np.unique(y, return_inverse=True)[1])"
    with pytest.raises(DataError) as err:
        save_npz(tmp_path / "t.npz", np.ones((5, 2)), labels)
    assert str(err.value) == f"save_npz: y holds labels that are not numbers ('maybe', 'no', 'yes'); {fix}, before saving"
    with pytest.raises(DataError) as err:
        save_npz(tmp_path / "t.npz", np.array([["a", "1"], ["b", "2"]]), [0, 1])
    assert str(err.value) == ("save_npz: X holds values that are not numbers ('a', 'b'); encode them as numbers (a text "
                              "column one-hot, e.g. pandas.get_dummies) before saving")
    assert list(tmp_path.iterdir()) == []
    np.savez(tmp_path / "t.npz", X=np.ones((5, 2)), y=np.array(labels))
    with pytest.raises(DataError) as err:
        NPZSource(str(tmp_path / "t.npz")).load()
    assert str(err.value) == (f"{tmp_path / 't.npz'}: 'y' holds labels that are not numbers ('maybe', 'no', 'yes'); "
                              f"{fix}, and save the archive again (dane.save_npz(path, X, y))")



@pytest.mark.parametrize("call, error, line", [
    (lambda tmp: save_npz(tmp / "none" / "t.npz", np.ones((2, 2)), [0, 1]), DataError,
     "save_npz: {tmp}/none/t.npz cannot be written: folder {tmp}/none does not exist; create it first, or choose "
     "another path"),  # np.savez's FileNotFoundError
    (lambda tmp: save_npz(tmp, np.ones((2, 2)), [0, 1]), DataError,
     "save_npz: {tmp}.npz cannot be written (is a directory); choose another path"),  # its IsADirectoryError
    (lambda tmp: save_npz(3, np.ones((2, 2)), [0, 1]), ConfigError,
     "save_npz: path must be a file's path (a str or a pathlib.Path), got 3"),  # pathlib's TypeError
    (lambda tmp: save_npz(tmp.parent / "t.npz", np.ones((2, 2)) * 1j, [0, 1]), DataError,
     "save_npz: X holds complex numbers; save X.real or abs(X), as the model needs"),  # saved X.real, warned
    (lambda tmp: save_npz(tmp.parent / "t.npz", np.ones((2, 2)), np.array([0, 1j])), DataError,
     "save_npz: y holds complex numbers; save y.real or abs(y), as the model needs"),
], ids=["no_folder", "a_folder", "a_number", "complex_X", "complex_y"])
def test_a_path_or_arrays_save_npz_cannot_write_are_one_line(tmp_path, call, error, line):
    """Each was a traceback from NumPy or pathlib, or (complex) an archive of the real parts with only NumPy's
    ComplexWarning."""
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(error, match=f"^{re.escape(line.format(tmp=tmp_path / 'd'))}$"):
        call(tmp_path / "d")
    assert [p.name for p in tmp_path.iterdir()] == ["d.npz"]


@pytest.mark.parametrize("key, value", [("categorical", None), ("categorical", 3), ("drop", None),
                                        ("drop", {"age": 1})])
def test_csv_columns_that_are_no_names_are_one_line(key, value):
    """CSVSource(..., categorical=None) was a TypeError ("'NoneType' object is not iterable"); a mapping, iterable
    over its keys, is no list of names either."""
    with pytest.raises(ConfigError, match=f"^data.{key} must be a column name or a list of them, got "
                                          f"{re.escape(repr(value))}; give "
                                          r"\[\] for none$"):
        CSVSource("x.csv", target="y", **{key: value})


# ---------------------------------------------------------------- labels
def test_check_labels_codes_each_loss():
    y = np.array([0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(check_labels(y, "logistic", "t"), [-1.0, 1.0, 1.0, -1.0])
    np.testing.assert_array_equal(check_labels(2 * y - 1, "logistic", "t"), [-1.0, 1.0, 1.0, -1.0])
    np.testing.assert_array_equal(check_labels(np.array([1.0, 1.0]), "logistic", "t"), [1.0, 1.0])  # a part
    for one_class in (0.0, 1.0, -1.0):  # the whole data set: one class is refused
        with pytest.raises(DataError, match=f"t: problem=logreg needs two classes, but every label is {one_class:g}"):
            check_labels(np.full(3, one_class), "logistic", "t", whole=True)
    # the whole set: any two values, the smaller -1 (LIBSVM's mushrooms {1, 2}, breast-cancer {2, 4}); a part alone cannot tell
    np.testing.assert_array_equal(check_labels(np.array([2.0, 1.0, 2.0]), "logistic", "t", whole=True), [1.0, -1.0, 1.0])
    np.testing.assert_array_equal(check_labels(np.array([4.0, 2.0]), "logistic", "t", whole=True), [1.0, -1.0])
    with pytest.raises(DataError, match="^t: problem=logreg on per-worker parts needs labels 0/1 or -1/\\+1, found "
                                        "{1, 2}; a part cannot tell which of two other values is the positive class"):
        check_labels(np.array([1.0, 2.0]), "logistic", "t")
    with pytest.raises(DataError, match="found labels {1, 2, 3}; use problem=softmax"):  # a part or the whole
        check_labels(np.array([1.0, 2.0, 3.0]), "logistic", "t")
    assert two_class_note(np.array([2.0, 1.0]), "logistic") == "labels 1 and 2 coded -1 and +1 (the larger value is the positive class)"
    assert two_class_note(np.array([0.0, 1.0]), "logistic") is None and two_class_note(np.array([1.0, 2.0]), "softmax") is None
    np.testing.assert_array_equal(check_labels(np.array([2.5, -1.0]), "squared", "t"), [2.5, -1.0])
    classes = check_labels(np.array([9.0, 2.0, 5.0, 2.0]), "softmax", "t")
    assert classes.dtype == np.int64 and classes.tolist() == [2, 0, 1, 0]
    part = check_labels(np.array([5.0, 9.0]), "softmax", "t", classes=np.array([2.0, 5.0, 9.0]))
    assert part.tolist() == [1, 2]  # the same numbering as the whole set, though class 2 is absent


@pytest.mark.parametrize(
    "y, loss, words",
    [
        ([0, 1, 2], "logistic", "csv:x.csv: problem=logreg needs two classes labelled 0/1 or -1/+1, found labels "
                                "{0, 1, 2}; use problem=softmax for more classes or map the labels"),
        (range(12), "logistic", "found labels {0, 1, 2, 3, 4, ...} (12 distinct)"),
        ([0, 1.5, 2.5], "softmax", "problem=softmax needs integer class labels, row 1 has 1.5"),
        ([1.0, np.nan], "squared", "label at row 1 is nan"),
        ([1.0, 4.0], "softmax_classes", "labels {4} are not among the classes {1, 2}"),
    ],
)
def test_check_labels_errors(y, loss, words):
    classes = None
    if loss == "softmax_classes":
        loss, classes = "softmax", np.array([1.0, 2.0])
    with pytest.raises(DataError) as err:
        check_labels(np.array(y, dtype=np.float64), loss, "csv:x.csv", classes=classes)
    assert words in one_line(err)


def test_check_labels_unknown_loss():
    with pytest.raises(ConfigError) as err:
        check_labels(np.ones(2), "hinge", "t")
    assert "loss must be one of squared|logistic|softmax" in one_line(err)


# ---------------------------------------------------------------- built-in sets and configs
@pytest.mark.parametrize("dataset, shape", [("iris", (150, 4)), ("diabetes", (442, 10)), ("digits", (1797, 64))])
def test_builtin_sklearn_sets_are_standardized(dataset, shape):
    table = BuiltinSource(dataset).load()
    assert table.X.shape == shape and table.y.shape == (shape[0],)
    moving = table.X.std(axis=0) > 0  # digits has constant (always blank) pixels
    np.testing.assert_allclose(table.X.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(table.X.std(axis=0)[moving], 1.0, atol=1e-12)
    if dataset == "diabetes":
        assert len(np.unique(table.y)) > 100  # real regression targets, not classes


def test_builtin_mnist_needs_a_data_dir(tmp_path):
    with pytest.raises(ConfigError) as err:
        BuiltinSource("mnist").load()
    assert "set data_dir=" in one_line(err)
    with pytest.raises(DataError) as err:
        BuiltinSource("admissions", data_dir=str(tmp_path)).load()
    assert f"tried {tmp_path / 'admissions.csv'}" in one_line(err)


@pytest.mark.parametrize("name, cls", [("csv", CSVSource), ("libsvm", LibSVMSource), ("npz", NPZSource)])
def test_file_configs_instantiate_and_require_a_path(tmp_path, name, cls):
    write(tmp_path, "f.csv", "y,a\n1,2\n0,4\n")
    write(tmp_path, "f.libsvm", "1 1:2\n0 1:4\n")
    save_npz(tmp_path / "f.npz", np.array([[2.0], [4.0]]), np.array([1.0, 0.0]))
    node = OmegaConf.create({"data_dir": str(tmp_path), "data": OmegaConf.load(CONF_DATA / f"{name}.yaml")})
    with pytest.raises(MissingMandatoryValue):
        instantiate(node.data)
    node.data.path = f"f.{name}"
    if name == "csv":
        node.data.target = "y"
    source = instantiate(node.data)
    assert type(source) is cls and source.name == name
    table = source.load()
    np.testing.assert_array_equal(table.y, [1.0, 0.0])
    values = table.X.toarray() if sp.issparse(table.X) else table.X
    assert values.shape == (2, 1) and (name == "csv" or values[:, 0].tolist() == [2.0, 4.0])


def test_builtin_config_instantiates():
    node = OmegaConf.create({"data_dir": None, "data": OmegaConf.load(CONF_DATA / "builtin.yaml")})
    source = instantiate(node.data)
    assert isinstance(source, BuiltinSource) and source.dataset == "breast_cancer"
    assert source.load().X.shape == (569, 30)


def test_shared_admissions_csv_matches_the_builtin_reader(monkeypatch, tmp_path):
    if not (SHARED_DATA / "admissions.csv").is_file():
        pytest.skip(f"{SHARED_DATA / 'admissions.csv'} is absent")
    monkeypatch.chdir(tmp_path)  # a relative data_dir is taken from the repository root, not the cwd
    data_dir = "../shared/data"
    table = CSVSource("admissions.csv", target="admit", categorical=["rank"], data_dir=data_dir).load()
    builtin = BuiltinSource("admissions", data_dir=data_dir).load()
    assert table.X.shape == (400, 6)
    assert table.feature_names == ["gre", "gpa", "rank=1", "rank=2", "rank=3", "rank=4"]
    np.testing.assert_allclose(table.X[:, :2], builtin.X[:, :2], atol=1e-12)  # same standardization
    np.testing.assert_array_equal(table.X[:, 2:].sum(axis=1), np.ones(400))
    np.testing.assert_array_equal(table.y, builtin.y)
    np.testing.assert_array_equal(check_labels(table.y, "logistic", table.name), 2 * builtin.y - 1)


# ---------------------------------------------------------------- CSV: columns left out (data.drop)
ID_CSV = "student_id,y,a,kind\nS0000,1,1.0,p\nS0001,0,2.0,q\nS0002,1,4.0,p\nS0003,0,8.0,q\n"


def test_csv_with_a_text_id_column_names_data_drop_and_drop_leaves_it_out(tmp_path):
    """A text ID column was refused with data.categorical=[student_id] as the only fix (one feature per row); now
    the line offers data.drop, which leaves the column out of X, its notes and its width."""
    path = write(tmp_path, "ids.csv", ID_CSV)
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y", categorical=("kind",)).load()
    assert one_line(err) == (f"{path} line 2, column 'student_id': 'S0000' is not a number; list it under "
                             "data.categorical=[student_id] to one-hot encode it, or leave it out with "
                             "data.drop=[student_id] (an ID, a name), or clean the file")
    table = CSVSource(str(path), target="y", categorical=("kind",), drop=("student_id",), standardize=False).load()
    assert table.feature_names == ["a", "kind=p", "kind=q"]
    np.testing.assert_array_equal(table.X, [[1, 1, 0], [2, 0, 1], [4, 1, 0], [8, 0, 1]])
    np.testing.assert_array_equal(table.y, [1, 0, 1, 0])
    assert table.notes[:2] == [f"read 4 rows x 3 features from {path}", "left out column(s) student_id (data.drop)"]
    numeric = write(tmp_path, "numeric_ids.csv", "id,y,a\n1000,1,1\n1001,0,3\n")  # read as a feature unless dropped
    assert CSVSource(str(numeric), target="y").load().feature_names == ["id", "a"]
    kept = CSVSource(str(numeric), target="y", drop="id").load()  # one name, as a string
    assert kept.feature_names == ["a"] and kept.X[:, 0].tolist() == [-1.0, 1.0]
    for r in range(2):
        write(tmp_path, f"part-{r}.csv", f"id,y,a,b\n{r},1,{r},2\n")
    assert CSVSource(str(tmp_path / "part-{rank}.csv"), target="y", standardize=False,
                     drop=["id"])._width(tmp_path / "part-0.csv") == 2


def test_csv_drop_is_checked_in_one_line(tmp_path):
    path = write(tmp_path, "ids.csv", ID_CSV)
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y", categorical=("kind",), drop=("studentid",)).load()
    assert one_line(err) == (f"{path} has no column 'studentid'; its columns are: student_id, y, a, kind; "
                             "set data.drop to one of them")
    refused = {
        "data.target=y is also in data.drop; the label cannot be left out, remove it from data.drop":
            dict(drop=("student_id", "y")),
        "data.client_column=kind is also in data.drop; the clients' column cannot be left out, remove it from "
        "data.drop": dict(drop=("kind",), sharding="column", client_column="kind"),
        "data.categorical and data.drop both name kind; a column is either one-hot encoded or left out, remove it "
        "from one of them": dict(drop=("kind",), categorical=("kind",)),
    }
    for line, keys in refused.items():
        with pytest.raises(ConfigError) as err:
            CSVSource(str(path), target="y", **keys)
        assert one_line(err) == line
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="y", drop=("student_id", "a", "kind")).load()
    assert one_line(err) == (f"{path} has only the label column 'y' besides the columns of data.drop (student_id, a, "
                             "kind); add at least one feature column or leave fewer out")


def test_csv_clients_from_a_column_with_an_id_column_left_out(tmp_path):
    """data.sharding=column reads its column as before when another column is dropped: each client's rows, and
    the features without the ID."""
    path = write(tmp_path, "ids.csv", ID_CSV)
    source = CSVSource(str(path), target="y", drop=("student_id",), sharding="column", client_column="kind",
                       standardize=False)
    table = source.load()
    assert table.feature_names == ["a"] and table.X[:, 0].tolist() == [1.0, 2.0, 4.0, 8.0]
    assert table.clients.tolist() == ["p", "q", "p", "q"]
    shards, notes = source.deal(table.y, 2, seed=0, clients=table.clients)
    assert [s.tolist() for s in shards] == [[0, 2], [1, 3]]
    assert notes[1:] == ["worker 0 (kind=p): 2 rows; 1: 2", "worker 1 (kind=q): 2 rows; 0: 2"]


def test_shared_admissions_with_an_id_column_left_out_is_the_file_without_it(tmp_path):
    """The reviewer's file: admissions.csv with a text student_id column first (a copy in tmp_path)."""
    shared = Path(os.environ.get("DANE_DATA_DIR") or SHARED_DATA) / "admissions.csv"
    if not shared.is_file():
        pytest.skip(f"{shared} is absent")
    lines = shared.read_text().splitlines()
    rows = [line for line in lines[1:] if line.strip()]
    path = write(tmp_path, "ids.csv", "student_id," + lines[0] + "\n"
                 + "".join(f"S{i:04d},{row}\n" for i, row in enumerate(rows)))
    plain = CSVSource(str(shared), target="admit", categorical=("rank",)).load()
    dropped = CSVSource(str(path), target="admit", categorical=("rank",), drop=("student_id",)).load()
    assert dropped.X.shape == (400, 6) and dropped.feature_names == plain.feature_names
    np.testing.assert_array_equal(dropped.X, plain.X)
    np.testing.assert_array_equal(dropped.y, plain.y)
    with pytest.raises(DataError) as err:
        CSVSource(str(path), target="admit", categorical=("rank",)).load()
    assert one_line(err).endswith("'S0000' is not a number; list it under data.categorical=[student_id] to one-hot "
                                  "encode it, or leave it out with data.drop=[student_id] (an ID, a name), or clean "
                                  "the file")


# ---------------------------------------------------------------- the Python API on a file
def test_a_file_source_passed_to_the_api_is_the_arrays_it_reads_with_an_intercept(tmp_path):
    """dane.problems.Ridge(data=CSVSource(...)) fits what the source reads (one-hot, standardized) plus the
    column of ones that conf/problem/ridge.yaml adds; on arrays the default is no intercept."""
    import dane

    rng = np.random.default_rng(0)
    rows = [f"{rng.normal() * 100:.6f},{rng.normal():.6f},{'abc'[i % 3]},{rng.normal() * 1e4:.6f}" for i in range(90)]
    path = write(tmp_path, "t.csv", "a,b,g,y\n" + "\n".join(rows) + "\n")
    source = CSVSource(str(path), target="y", categorical=("g",))
    from_file = dane.problems.Ridge(data=source, lam=1e-3, optimum="auto")
    table = source.load()
    ones = np.ones((table.n, 1))
    from_arrays = dane.problems.Ridge(np.hstack([table.X, ones]), table.y, lam=1e-3, optimum="auto")
    assert from_file.fit_intercept and not from_arrays.fit_intercept
    runs = [dane.fit(p, "dane", workers=3, rounds=5) for p in (from_file, from_arrays)]
    assert runs[0].table["objective"] == runs[1].table["objective"]
    assert runs[0].records[0]["objective"] - runs[0].records[0]["suboptimality"] == pytest.approx(
        runs[1].records[0]["objective"] - runs[1].records[0]["suboptimality"], rel=1e-12)  # the same O*
    with pytest.raises(ConfigError, match="takes arrays X and y, or data= a file source"):
        dane.problems.Ridge(table.X, table.y, data=source)
    with pytest.raises(ConfigError, match=r"^dane.problems.LogReg got data= a tuple, not a data source; pass arrays "
                                          r"as LogReg\(X, y\)"):
        dane.problems.LogReg(data=(table.X, table.y))  # was an AttributeError from the run, on `presharded`


class BytesPath:
    """An os.PathLike whose path is bytes (`os.fspath` returns it as it is)."""

    def __fspath__(self) -> bytes:
        return b"x.csv"


@pytest.mark.parametrize("cls, name, kwargs", [(CSVSource, "t.csv", {"target": "y"}), (NPZSource, "t.npz", {}),
                                               (LibSVMSource, "t.svm", {})])
def test_a_file_source_takes_a_pathlib_path_as_its_str(tmp_path, cls, name, kwargs):
    """``CSVSource(Path(...))`` (and NPZSource's, LibSVMSource's) was refused with "data.path must be a file name, got
    PosixPath(...)": a path given as an os.PathLike is kept as its str (``data_dir`` too), and reads what the str
    reads; what is no path (a number, bytes) is still one line naming data.path."""
    X, y = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]), np.array([1.0, -1.0, 1.0])
    if cls is CSVSource:
        write(tmp_path, name, "a,b,y\n" + "".join(f"{a},{b},{t}\n" for (a, b), t in zip(X, y)))
        kwargs = {**kwargs, "standardize": False}
    elif cls is NPZSource:
        save_npz(tmp_path / name, X, y)
    else:
        dump_svmlight_file(X, y, str(tmp_path / name), zero_based=True)
        kwargs = {**kwargs, "n_features": 2, "zero_based": True}
    given = cls(tmp_path / name, **kwargs)
    assert given.path == str(tmp_path / name) and type(given.path) is str
    assert given == cls(str(tmp_path / name), **kwargs)
    np.testing.assert_array_equal(np.asarray(given.load().X.todense() if sp.issparse(given.load().X)
                                             else given.load().X), X)
    in_dir = cls(Path(name), data_dir=tmp_path, **kwargs)
    assert (in_dir.path, in_dir.data_dir) == (name, str(tmp_path))
    np.testing.assert_array_equal(in_dir.load().y, y)
    for bad in (3, BytesPath()):
        with pytest.raises(ConfigError) as err:
            cls(bad, **kwargs)
        assert one_line(err).startswith("data.path must be a file name (a str or a pathlib.Path), got ")
