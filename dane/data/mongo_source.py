"""``data=mongo``: samples read from a MongoDB store by id, so each worker fetches only the rows it was dealt.

    dane data push admissions.csv --target admit --uri stores/demo --collection admissions
    dane train problem=logreg data=mongo data.uri=stores/demo data.collection=admissions workers=4

A run deals rows from the projection of ``(id, y)`` alone (`labels`; `dane.data.sharding` as every
source, over rows in id order, so a data set pushed from a file is dealt exactly as ``data=csv`` deals
that file), then each worker fetches its own rows with ``{"id": {"$in": ids}}`` (`fetch`). The
store's layout, engines and crash safety: `dane.data.mongo_store`. The rows are stored as the file
source read them at push time (imputed, one-hot coded, scaled if asked then), so this source has no
``standardize`` of its own: scaling over all rows would need every row in one place.

Clients from a column (``data.sharding=column``): a table pushed with ``--client-column NAME`` holds
each row's client in the field ``client``; a run with ``data.client_column=NAME`` reads the
projection ``(id, client)`` alone (`clients`) and deals it by `dane.data.sharding.column_shards`, so
the shards, and the notes, are those of the file source on the file pushed.

    dane data push adult_like.csv --target income --categorical education sex --client-column workclass \\
        --uri stores/demo --collection adult
    dane train problem=logreg data=mongo data.uri=stores/demo data.collection=adult \\
        data.sharding=column data.client_column=workclass workers=5
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from dane.data.mongo_store import (CLIENT, Store, connect, is_server, location, name_problem, push_refusal, reading,
                                   unreadable)
from dane.data.sharding import COLUMN, ShardingKeys
from dane.data.table import Table, missing_rows
from dane.errors import ConfigError, DataError, brief, plural

_STORES: dict[str, Store] = {}
_LABELS: dict[tuple[str, str, str | None], tuple[np.ndarray, np.ndarray, dict]] = {}


def reads_the_store(method):
    """``method`` of `MongoSource`, with what a damaged store raises when read (`unreadable`) as one line that
    names the data set and the push that uploads it again (the push drops what it cannot read); where a push is
    writing the store (`dane.data.mongo_store.push_refusal`), that, or a refusal of what it has not finished (a
    short data set, one not yet there), is the line that says to wait for that push instead.  The read holds an
    embedded store shared (`dane.data.mongo_store.reading`): no push writes until it ends."""
    @functools.wraps(method)
    def read(self, *args):
        try:
            with reading(self.location):
                return method(self, *args)
        except Exception as err:
            if not (unreadable(err) or isinstance(err, DataError)):
                raise
            busy = push_refusal(self.location)
            if busy:
                raise DataError(busy) from None
            if not unreadable(err):
                raise
            detail = brief(err, 100)
            raise DataError(f"{self.store().where(self.collection)} cannot be read ({type(err).__name__}"
                            f"{': ' + detail if detail else ''}); push it again: dane data push FILE --uri {self.uri} "
                            f"--collection {self.collection}") from None
    return read


@dataclass(frozen=True)
class MongoSource(ShardingKeys):
    """Data set ``collection`` of the store ``uri`` (``conf/data/mongo.yaml``): a ``mongodb://`` server, or
    the folder of an embedded store (relative: from the working folder, as ``dane data push --uri`` takes it:
    `dane.data.mongo_store.location`)."""

    uri: str = ""
    collection: str = ""
    test_fraction: float = 0.2  # networks: the held-out share (seeded, stratified); unused by a linear model
    name: str = "mongo"

    presharded = False  # the store is dealt by id, not read as per-worker files
    by_id = True        # linear models: deal from `labels`, fetch each worker's rows with `fetch`
    overlap = False     # networks: no overlapping shards (dane.data.overlap) here

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri:
            raise ConfigError("data.uri is empty; set data.uri=mongodb://HOST/DATABASE or data.uri=/folder/of/store")
        # the push's rule for this store (an embedded one's is stricter): a name no push can write has no data set
        problem = name_problem(self.collection, embedded=not is_server(self.uri))
        if problem:
            raise ConfigError(f"data.collection={self.collection!r}: {problem}; give the name of a data set pushed "
                              "with dane data push ... --collection NAME")
        self.check_sharding(columns="the client column of a table pushed with dane data push FILE --client-column NAME")
        if not (isinstance(self.test_fraction, float) and 0.0 < self.test_fraction < 1.0):
            raise ConfigError(f"data.test_fraction must be in (0, 1), got {self.test_fraction!r}")

    @property
    def location(self) -> str:
        """The server URI, or the embedded store's absolute folder."""
        return location(self.uri)

    def store(self) -> Store:
        if self.location not in _STORES:
            _STORES[self.location] = connect(self.location)
        return _STORES[self.location]

    @reads_the_store
    def manifest(self) -> dict:
        """The data set's manifest, checked complete: one line for a missing data set, one whose count of
        documents is not its ``n``, or one whose push did not mark it complete."""
        store = self.store()
        manifest = store.manifest(self.collection)
        if manifest is None:
            known = sorted(d["_id"] for d in store.find("dane_manifest", {}, ["_id"]))
            raise DataError(f"data.collection={self.collection}: no such data set in {self.uri} (it holds: "
                            f"{', '.join(known) or 'none'}); push it first: dane data push FILE --uri {self.uri} "
                            f"--collection {self.collection}")
        count, n, state = store.count(self.collection), manifest.get("n"), manifest.get("state")
        if isinstance(n, int) and count > n:
            raise DataError(f"{store.where(self.collection)} holds {count} documents for {n} samples ({state}); push "
                            f"it again to repair it: dane data push ... --collection {self.collection}")
        if state != "complete" and count == n:
            raise DataError(f"{store.where(self.collection)} holds all {n} samples, but its upload was not marked "
                            f"finished (state {state}: the push stopped before its last step); push it again to "
                            f"finish it: dane data push ... --collection {self.collection}")
        if state != "complete" or count != n:
            raise DataError(f"{store.where(self.collection)} is short: {count} of {n} samples ({state}); push it "
                            f"again to complete it: dane data push ... --collection {self.collection}")
        return manifest

    @reads_the_store
    def labels(self) -> tuple[np.ndarray, np.ndarray, dict]:
        """Every sample's id and label, in id order, read as the projection ``(id, y)``, and the manifest:
        `held_labels` with the store's manifest read as it is now (embedded: what the engine cached is released
        first, since another process may have pushed the data set again); one line while a push writes the store."""
        busy = push_refusal(self.location)
        if busy:
            raise DataError(busy)
        self.store().release()
        return self.held_labels()

    @reads_the_store
    def held_labels(self) -> tuple[np.ndarray, np.ndarray, dict]:
        """`labels`, kept for the process under the data set's push (its manifest's ``push_id``, new at every push
        that writes): a repeated read costs one manifest lookup, and a data set pushed again, by this process or
        seen since a release, is read afresh. `images` asks here, each minibatch, without the release, which would
        make the embedded engine decode every stored image again."""
        held = self.store().manifest(self.collection)  # one lookup: the push the store holds now
        key = (self.location, self.collection, held.get("push_id") if held else None)
        if key not in _LABELS or not held or held.get("state") != "complete":
            manifest = self.manifest()
            key = (self.location, self.collection, manifest.get("push_id"))
            docs = sorted(self.store().find(self.collection, {}, ["id", "y"]), key=lambda doc: doc["id"])
            self.store().release()  # embedded: mongita read (and cached) whole documents for this projection
            ids = np.array([doc["id"] for doc in docs], dtype=np.int64)
            if not np.array_equal(ids, np.arange(1, manifest["n"] + 1)):
                raise DataError(f"{self.store().where(self.collection)}: the ids are not 1..{manifest['n']}; "
                                "push it again with --replace")
            _LABELS.clear()
            _LABELS[key] = ids, np.array([doc["y"] for doc in docs], dtype=np.float64), manifest
        return _LABELS[key]

    @reads_the_store
    def column(self, which: str | int, push_id: str | None = None) -> tuple[np.ndarray, str]:
        """One feature over every row, in id order, read as the projection ``(id, <its field>)``, and its name:
        ``which`` a feature name or a 0-based index (``data.skew_on``; a column-sharding key reads the same);
        ``push_id`` as `fetch`'s."""
        _, _, manifest = self.labels()
        self.check_push(manifest, push_id)
        columns, names = manifest["columns"], manifest["feature_names"] or manifest["columns"]
        if manifest["kind"] != "dense":
            raise ConfigError(f"data.skew_on={which}: data set {self.collection} holds {manifest['kind']} rows, "
                              "whose columns are not fields; use data.skew_on=y")
        if isinstance(which, int):
            if not 0 <= which < len(columns):
                raise ConfigError(f"data.skew_on={which} is not a column index of the {len(columns)} features; "
                                  f"use 0..{len(columns) - 1}")
            j = which
        elif which in names:
            j = names.index(which)
        else:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(f"data.skew_on={which} is not a feature of this data; its columns are: {shown}")
        docs = sorted(self.store().find(self.collection, {}, ["id", columns[j]]), key=lambda doc: doc["id"])
        self.store().release()
        name = names[j] if manifest["feature_names"] else f"column {j}"
        return np.array([doc[columns[j]] for doc in docs], dtype=np.float64), name

    @reads_the_store
    def clients(self, push_id: str | None = None) -> np.ndarray:
        """Every row's client (``data.client_column``), in id order, read as the projection ``(id, client)``:
        one line where the data set was pushed without that client column; ``push_id`` as `fetch`'s."""
        _, _, manifest = self.labels()
        self.check_push(manifest, push_id)
        stored = manifest.get("client_column")
        if stored != self.client_column:
            held = f"holds the clients of column '{stored}'" if stored else "was pushed without a client column"
            raise DataError(f"data.client_column={self.client_column}: data set {self.collection} in {self.uri} "
                            f"{held}; push it with them: dane data push FILE --client-column {self.client_column} "
                            f"--uri {self.uri} --collection {self.collection} --replace")
        docs = sorted(self.store().find(self.collection, {}, ["id", CLIENT]), key=lambda doc: doc["id"])
        self.store().release()
        clients = np.array([doc.get(CLIENT) for doc in docs])
        missing = np.flatnonzero(missing_rows(clients))
        if missing.size:  # pushed before a push refused a row without a client (dane.data.npz_source)
            first = docs[missing[0]]
            raise DataError(f"{self.store().where(self.collection)}: sample {first['id']} has no client "
                            f"(data.client_column={self.client_column} is {first.get(CLIENT)!r}; {missing.size} of "
                            f"{len(docs)} samples); every row needs a client: fill the column in, then push the file "
                            f"again: dane data push FILE --client-column {self.client_column} --uri {self.uri} "
                            f"--collection {self.collection} --replace")
        return clients

    @reads_the_store
    def fetch(self, ids, push_id: str | None = None) -> Table:
        """The rows of ``ids`` (in that order), fetched with ``$in``: X dense or CSR as pushed, y as pushed; with
        ``push_id`` (the push whose labels a run dealt: `dane.problems.linear_models.LinearModelConfig`), one line
        where the data set has been pushed again since, whose rows would not be the labels' (`check_push`)."""
        _, _, manifest = self.labels()
        self.check_push(manifest, push_id)
        if manifest["kind"] == "images":
            raise ConfigError(f"data.collection={self.collection} holds images; a linear model needs a table "
                              "(push a CSV, LIBSVM or NPZ), or train a network on it (problem=neural)")
        columns = manifest["columns"]
        fields = ["y", "idx", "val"] if manifest["kind"] == "sparse" else ["y", *columns]
        docs = self.store().by_ids(self.collection, np.asarray(ids), fields)
        self.store().release()
        y = np.array([doc["y"] for doc in docs], dtype=np.float64)
        if manifest["kind"] == "sparse":
            indptr = np.cumsum([0] + [len(doc["idx"]) for doc in docs])
            indices = np.array([i for doc in docs for i in doc["idx"]], dtype=np.int32)
            data = np.array([v for doc in docs for v in doc["val"]], dtype=np.float64)
            X = sp.csr_matrix((data, indices, indptr), shape=(len(docs), manifest["d"]))
        else:
            X = np.array([[doc[c] for c in columns] for doc in docs], dtype=np.float64).reshape(len(docs), len(columns))
        names = manifest["feature_names"] or None
        notes = [f"fetched {len(docs)} of {plural(manifest['n'], 'sample')} by id from "
                 f"{self.store().where(self.collection)}, {pushed_as(manifest)}"]
        return Table(X=X, y=y, name=f"mongo:{self.collection}", notes=notes, feature_names=names)

    def check_push(self, manifest: dict, push_id: str | None,
                   why: str = "the run's labels and rows would come from two data sets",
                   then: str = "run again (nothing was trained)") -> None:
        """One line where the data set's push now (``manifest``'s ``push_id``, new at every push that writes) is not
        ``push_id``, the push a run first read (None: nothing to check): a ``--replace`` push since, whose data would
        mix two data sets in one run; ``why`` says what would mix, ``then`` what to do."""
        if push_id is not None and manifest.get("push_id") != push_id:
            raise DataError(f"{self.store().where(self.collection)} was pushed again since this run first read it "
                            f"({why}); {then}")

    def pushed(self, push_id: str | None) -> str | None:
        """The push ``push_id`` of this data set, named for a line (`dane.loop.worker.check_one_push`): the
        collection, the store and the push's id as the notes abbreviate it (`pushed_as`); None for None."""
        return None if push_id is None else f"{self.store().where(self.collection)}, push {push_id[:12]}"

    def load(self) -> Table:
        """Every row (one process holding the whole data set: a reference solve, a batched simulator)."""
        ids, _, _ = self.labels()
        return self.fetch(ids)

    @reads_the_store
    def images(self, ids, push_id: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The images of ``ids`` (decoded from their GridFS files, uint8, stacked) and their labels; with
        ``push_id`` (the push a run's first read saw: `StoreRows`), one line where the data set has been pushed
        again since, whose images would mix two data sets in one run."""
        from dane.data.mongo_push import UnreadableImage, decode_image
        from dane.data.mongo_store import read_gridfs

        _, _, manifest = self.held_labels()
        self.check_push(manifest, push_id, why="its images are read as the run goes, so the rest of the run would "
                                               "train on other data",
                        then="start the run again (no resume=) with overwrite=true or a new out_dir")
        if manifest["kind"] != "images":
            raise ConfigError(f"data.collection={self.collection} holds a table, not images; push a folder of "
                              "images (FOLDER/<label>/<image>) for a network")
        docs = self.store().by_ids(self.collection, np.asarray(ids), ["y", "file_id", "filename"])
        data = read_gridfs(self.store(), self.collection, [doc["file_id"] for doc in docs])
        pixels = []
        for doc in docs:
            try:
                pixels.append(decode_image(data[doc["file_id"]]))
            except UnreadableImage as err:  # pushed before a push checked its images, or changed in the store since
                raise DataError(f"{self.store().where(self.collection)}: sample {doc['id']} ({doc.get('filename')}) is "
                                f"not an image Pillow can read ({err}); replace that file in the folder and push it "
                                f"again: dane data push FOLDER --uri {self.uri} --collection {self.collection} "
                                "--replace") from None
        shapes = {p.shape for p in pixels}
        if len(shapes) > 1:
            raise DataError(f"{self.store().where(self.collection)}: the images have {len(shapes)} shapes "
                            f"({', '.join(map(str, sorted(shapes)[:3]))}); resize them to one before pushing")
        return np.stack(pixels), np.array([doc["y"] for doc in docs], dtype=np.float64)


class StoreRows:
    """An image data set's rows in a store, read by id only when indexed: ``rows[index]`` is the float32
    tensor of the images of ``ids[index]`` (one ``$in`` query), ``subset(index)`` the same rows lazily."""

    def __init__(self, source: MongoSource, ids: np.ndarray, sample_shape: tuple[int, ...], push_id: str | None,
                 dtype: torch.dtype = torch.float32):
        self.source, self.ids, self.sample_shape, self.dtype = source, np.asarray(ids, dtype=np.int64), sample_shape, dtype
        self.push_id = push_id  # the push the run read first: `MongoSource.images` refuses another's images

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.ids), *self.sample_shape)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, index) -> "StoreRows":
        return StoreRows(self.source, self.ids[_positions(index)], self.sample_shape, self.push_id, self.dtype)

    def to(self, dtype: torch.dtype) -> "StoreRows":
        return StoreRows(self.source, self.ids, self.sample_shape, self.push_id, dtype)

    def __getitem__(self, index) -> torch.Tensor:
        ids = np.asarray(self.ids[_positions(index)])  # any index shape: a worker's shard, all shards stacked
        pixels = pixel_tensor(self.source.images(ids.reshape(-1), self.push_id)[0]).to(self.dtype)
        return pixels.reshape(*ids.shape, *self.sample_shape)


def pushed_as(manifest: dict) -> str:
    """Which push of a data set a run read, for its notes (a data set pushed again with ``--replace`` holds other
    data under the same name): the source the push named, the SHA-256 of its bytes and options (``fingerprint``,
    abbreviated; none where a caller of `dane.data.mongo_push` gave none) and the push's ``push_id``."""
    marks = [f"sha256 {manifest['fingerprint'][:16]}" if manifest.get("fingerprint") else "",
             f"push {manifest['push_id'][:12]}" if manifest.get("push_id") else ""]
    marks = [mark for mark in marks if mark]
    return f"pushed from {manifest.get('source', '?')}" + (f" ({', '.join(marks)})" if marks else "")


def _positions(index):
    return index.cpu().numpy() if isinstance(index, torch.Tensor) else index


def pixel_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images (k x H x W, or k x H x W x C) as float32 k x C x H x W in [0, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) / 255.0
    return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


def image_dataset(source: MongoSource, seed: int):
    """The `dane.data.Dataset` of an image data set in a store: labels read now (the (id, y) projection),
    images when a worker indexes ``train_x`` or ``test_x`` (`StoreRows`); the test rows a seeded,
    stratified ``test_fraction`` of the ids."""
    from dane.data.dataset import Dataset, stratified_split

    ids, y, manifest = source.labels()
    if source.sharding == COLUMN:
        raise ConfigError(f"problem.data.sharding=column: data set {source.collection} holds images, which carry no "
                          "client column; use another problem.data.sharding (iid, dirichlet, classes, quantity)")
    if manifest["kind"] != "images":
        raise ConfigError(f"data.collection={source.collection} holds a table ({manifest['kind']}); a network here "
                          "reads images (push a folder FOLDER/<label>/<image>), a table trains a linear model")
    train_ids, train_y, test_ids, test_y = stratified_split(
        ids, y.astype(np.int64), test_fraction=source.test_fraction, seed=seed,
        name=source.store().where(source.collection), key="problem.data.test_fraction", classes=manifest["classes"],
        then=f"then push the folder again: dane data push FOLDER --uri {source.uri} --collection {source.collection} "
             "--replace")
    pushed = manifest.get("push_id")  # each read checks it: a push since would mix two data sets in one run
    first = pixel_tensor(source.images(ids[:1], pushed)[0])
    shape = tuple(first.shape[1:])
    order, test_order = np.argsort(train_ids, kind="stable"), np.argsort(test_ids, kind="stable")
    note = (f"{source.store().where(source.collection)}: {len(train_ids)} train / {len(test_ids)} test images "
            f"(seeded stratified hold-out of {source.test_fraction:g}), {' x '.join(map(str, shape))}, read by id, "
            f"{pushed_as(manifest)}")
    return Dataset(train_x=StoreRows(source, train_ids[order], shape, pushed), train_y=torch.as_tensor(train_y[order]),
                   test_x=StoreRows(source, test_ids[test_order], shape, pushed),
                   test_y=torch.as_tensor(test_y[test_order]),
                   num_classes=len(manifest["classes"]), name=f"mongo:{source.collection}", notes=[note],
                   split=f"seeded stratified hold-out of {source.test_fraction:g}")
