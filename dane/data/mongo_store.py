r"""A MongoDB data store: one collection of samples, each a document with its integer ``id`` (1..n).

Layout of a data set named ``NAME`` in database ``dane`` (the URI's database on a server):

- ``NAME``: one document per sample, ``_id`` the decimal string of ``id`` (mongita takes only string or
  ObjectId keys): ``{id, y, <one field per feature>}`` for dense rows
  (every column its own field, so a projection reads one column), ``{id, y, idx, val}`` for a sparse
  (LIBSVM or CSR) row, ``{id, y, file_id, filename}`` for an image, whose bytes are a GridFS file;
  a table pushed with a client column (``--client-column``) adds ``client``, the row's value of it
  (a number or a string, as the file source read it). An ascending index on ``id``.
- ``NAME.files`` and ``NAME.chunks`` (``NAME_files``, ``NAME_chunks`` embedded: mongita refuses dots in
  collection names): the GridFS bucket ``NAME`` in GridFS's own layout (files:
  ``_id, length, chunkSize, uploadDate, filename, metadata``; chunks: ``files_id, n, data``), so
  ``mongofiles --prefix NAME`` or ``gridfs.GridFSBucket(db, "NAME")`` read a server's copy; a file's
  ``_id`` is its sample's ``_id`` (the id as a string), a chunk's ``"<file _id>:<n>"``.
- ``dane_manifest``: one document per data set, ``_id = NAME``: ``state`` (uploading | complete), ``n``,
  ``kind`` (dense | sparse | images), ``d``, ``columns`` (the feature fields, in order),
  ``feature_names``, ``classes`` (an image folder's label names), ``fingerprint`` (the source's
  bytes and the push options, SHA-256) and ``push_id`` (random, new each time a push completes an
  upload or a repair: a reader keeps what it read under it, `dane.data.mongo_source.MongoSource.held_labels`);
  with a client column, ``client_column`` (its name in the file: a header, an ``.npz`` key, ``qid``)
  and ``client_field`` (``client``, the field holding it).

Crash safety (`push`): the manifest is written first (``uploading``), then the samples in id order, an
image's chunks and files document before its sample document (a sample document exists only once its
bytes do), then the manifest is marked ``complete`` after the stored ids are checked to be exactly 1..n.
A later push of the same source finds an ``uploading`` manifest, drops the orphan GridFS pieces of ids
that have no sample document and inserts the missing samples (``_id`` from ``id``: a document is
never stored twice); a store the engine cannot read back (a write cut mid-file) is dropped and uploaded
again. A reader refuses any data set whose manifest is not ``complete`` or whose count is not ``n``, and
one the engine cannot decode (`unreadable`), in one line that gives the push to make.

One writer (`pushing`): a push into an embedded store holds the folder's lock (`dane.records.lock.take_lock`) from
before its first read to its end, so that a second push into the store is refused, not run beside it (mongita keeps
no lock of its own: two processes rewriting one collection's files leave files neither can read), and a run that
starts meanwhile is told to wait (`push_refusal`).  No reader beside it (`reading`): each read of a run holds the
folder's ``flock`` shared, a push exclusive, so a push waits for a read in flight and a read while a push writes is
refused with the same line. Nothing here locks a server: two pushes into one data set at
once are not guarded there.

Engines (`connect`): a ``mongodb://`` or ``mongodb+srv://`` URI is a server, through PyMongo; any other
``uri`` is a folder holding an embedded store, mongita's disk engine (PyMongo's API over BSON files:
one data file, a location index and the indexes' metadata per collection). What differs, all inside
`Store`: mongita has no projection, so `Store.find` drops the fields a projection leaves out after
reading whole documents (a server projects before sending); mongita answers ``$in`` on an index by
testing every indexed key against the list (O(n k) for k ids of n), so `Store.by_ids` asks it id by id
(an equality on the index is one lookup) where a server gets ``$in`` batches; mongita refuses a dot in a
collection name (`Store.bucket`); mongita caches every document it decodes until `Store.release`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from dane.errors import ConfigError, DataError, brief
from dane.records.lock import Refusals, flocked, lock_refusal, take_lock

DATABASE = "dane"            # the database of an embedded store, and of a server URI that names none
MANIFEST = "dane_manifest"
CHUNK_SIZE = 255 * 1024      # GridFS's default chunk size
BATCH = 500                  # documents per insert_many: the most a killed push has half written
IN_BATCH = 20000             # ids per $in query: far under a server's 16 MB command limit
CLIENT = "client"            # the field of a row's client value (a push with --client-column)
RESERVED = ("_id", "id", "y", "idx", "val", "file_id", "filename", CLIENT)
SERVER_SCHEMES = ("mongodb://", "mongodb+srv://")
SERVER_WAIT_MS = 3000        # how long PyMongo looks for a server before a run says none answers


def is_server(uri: str) -> bool:
    """Whether ``uri`` names a MongoDB server (else: an embedded store's folder)."""
    return str(uri).startswith(SERVER_SCHEMES)


def location(uri: str) -> str:
    """The store ``uri`` names: a server's URI as given, or an embedded store's folder as an absolute path, a
    relative one taken from the working folder, as a command line's relative paths are (a run's ``results/``, a
    data file, ``--config-dir``), in a checkout as in an installed package; ``dane data push --uri DIR`` and a run's
    ``data.uri=DIR`` started in the same folder name the same store.  (Not `dane.data.table.resolve_dir`'s rule
    for ``data_dir``, whose default ``../shared/data`` is the checkout's: a store is the user's own folder.)"""
    return uri if is_server(uri) else str((Path.cwd() / Path(uri).expanduser()).resolve())


#: the characters of a data set's name the embedded engine keeps as they are (mongita refuses some others and drops
#: the rest from the collection's folder name, where two names could then share one folder)
EMBEDDED_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
EMBEDDED_NAME_MAX = 64 - len("_chunks")  # mongita's longest collection name, less the GridFS bucket's suffix


def name_problem(name: str, *, embedded: bool) -> str | None:
    """Why ``name`` cannot name a data set in a store, in a few words naming the bad character (None: it can).
    Any store: MongoDB's rules (no ``$`` or NUL, not empty, no leading ``.`` or ``system.``); the embedded engine
    (``embedded``, for a push and for a run reading what a push wrote): letters, digits, ``_`` and ``-`` only, no ``_`` first or last, at most
    `EMBEDDED_NAME_MAX` characters, and not the manifest's own collection."""
    if not isinstance(name, str) or not name:
        return "the name is empty"
    bad = next((i for i, ch in enumerate(name) if ch in "$\0"), None)
    if bad is None and embedded:
        bad = next((i for i, ch in enumerate(name) if ch not in EMBEDDED_NAME), None)
    if bad is not None:
        where = "an embedded store's" if embedded and name[bad] not in "$\0" else "a"
        return f"{name[bad]!r} (character {bad + 1}) is not allowed in {where} collection name"
    if name.startswith((".", "system.")):
        return f"a collection name cannot start with {'.' if name.startswith('.') else 'system.'!r}"
    if embedded and (name[0] == "_" or name[-1] == "_"):
        return "an embedded store's collection name cannot start or end with '_'"
    if embedded and len(name) > EMBEDDED_NAME_MAX:
        return f"an embedded store's collection name has at most {EMBEDDED_NAME_MAX} characters, not {len(name)}"
    if name == MANIFEST:
        return f"{MANIFEST} is the store's list of data sets"
    return None


def server_database(uri: str) -> str:
    """The database a server URI names (``mongodb://host/NAME``), or `DATABASE`; one line for a bad URI."""
    try:
        from pymongo.uri_parser import parse_uri
    except ImportError:
        raise ConfigError(f"data.uri={uri} names a MongoDB server, which needs PyMongo: pip install pymongo") from None
    try:
        parsed = parse_uri(uri)
    except Exception as err:  # pymongo's InvalidURI, ConfigurationError (an SRV lookup), ValueError
        raise ConfigError(f"data.uri={uri} is not a MongoDB URI ({brief(err, 200)}); "
                          "write mongodb://HOST[:PORT]/DATABASE, or a folder for an embedded store") from None
    return parsed.get("database") or DATABASE


@dataclass
class Store:
    """A database handle and whether it is embedded (mongita) or a server (PyMongo)."""

    db: object
    uri: str
    embedded: bool
    client: object = None

    def release(self) -> None:
        """Drop what the embedded engine keeps of the documents read (mongita caches every document it
        decodes, and reads whole documents for a projection): after the (id, y) scan, a worker keeps no row it
        was not dealt. The client reopens its files on the next call. A server's client keeps nothing."""
        if self.embedded and self.client is not None:
            self.client.close()

    def find(self, name: str, query: dict, fields: Iterable[str] | None = None) -> Iterator[dict]:
        """Documents of collection ``name`` matching ``query``, with only ``fields`` (all: None)."""
        collection = self.db[name]
        if not self.embedded:
            projection = None if fields is None else {"_id": 0, **{f: 1 for f in fields}}
            yield from collection.find(query, projection)
            return
        keep = None if fields is None else set(fields)
        for doc in collection.find(query):
            yield doc if keep is None else {k: v for k, v in doc.items() if k in keep}

    def by_ids(self, name: str, ids: np.ndarray, fields: Iterable[str] | None = None) -> list[dict]:
        """The documents of ``ids`` (integers), in the order of ``ids``; `DataError` if one is missing."""
        ids = [int(i) for i in ids]
        found: dict[int, dict] = {}
        fields = None if fields is None else sorted(set(fields) | {"id"})
        if self.embedded:  # mongita tests each indexed key against a $in list: O(n k); an equality is a lookup
            queries = ({"id": i} for i in ids)
        else:
            queries = ({"id": {"$in": ids[start:start + IN_BATCH]}} for start in range(0, len(ids), IN_BATCH))
        for query in queries:
            for doc in self.find(name, query, fields):
                found[int(doc["id"])] = doc
        missing = [i for i in ids if i not in found]
        if missing:
            raise DataError(f"{self.where(name)} has no sample with id {missing[0]} ({len(missing)} of the "
                            f"{len(ids)} asked are missing); push the data again: dane data push ...")
        return [found[i] for i in ids]

    def bucket(self, name: str, part: str) -> str:
        """GridFS collection ``part`` (files | chunks) of bucket ``name``: ``NAME.files`` on a server (GridFS's
        own name), ``NAME_files`` embedded (mongita refuses a dot in a collection name; no server tool reads
        mongita's files anyway)."""
        return f"{name}{'_' if self.embedded else '.'}{part}"

    def where(self, name: str) -> str:
        return f"collection {name} of {self.uri}"

    def manifest(self, name: str) -> dict | None:
        """The data set's manifest (None: no such data set); the first call that reaches a server, so an
        unreachable one is one line here."""
        try:
            return self.db[MANIFEST].find_one({"_id": name})
        except Exception as err:
            if self.embedded or not type(err).__module__.startswith("pymongo"):
                raise
            raise DataError(f"data.uri={self.uri}: no MongoDB server answers ({type(err).__name__}: "
                            f"{brief(err, 100)}); start it, or check the host and port") from None

    def count(self, name: str) -> int:
        return self.db[name].count_documents({})


def connect(uri: str, *, create: bool = False) -> Store:
    """The store ``uri`` names: a server (``mongodb://...``, PyMongo) or an embedded store's folder
    (mongita; ``create``: made when absent, else it must exist)."""
    if not isinstance(uri, str) or not uri:
        raise ConfigError(f"data.uri must be a mongodb:// URI or a folder, got {uri!r}")
    if is_server(uri):
        database = server_database(uri)
        from pymongo import MongoClient  # server_database has checked that PyMongo is there

        client = MongoClient(uri, serverSelectionTimeoutMS=SERVER_WAIT_MS)
        return Store(client[database], uri, embedded=False, client=client)
    folder = Path(uri).expanduser()
    if not create and not folder.is_dir():
        raise DataError(f"data.uri={uri}: no store there ({folder} is not a folder); push one first: "
                        f"dane data push FILE --uri {uri} --collection NAME")
    if create and folder.exists() and not folder.is_dir():
        raise DataError(f"data.uri={uri} is a file, not a store's folder; give a folder (made if absent) or a "
                        "mongodb:// URI")
    try:
        from mongita import MongitaClientDisk
    except ImportError:
        raise ConfigError(f"data.uri={uri} is an embedded store, which needs mongita: pip install mongita "
                          "(make setup installs it)") from None
    folder.mkdir(parents=True, exist_ok=True)
    # mongita keeps one engine, and its cache of documents, per folder name: the resolved name gives every handle
    # on this folder one engine, so what one writes (a push) the others read, and a new handle clears the cache
    client = MongitaClientDisk(str(folder.resolve()))
    return Store(client[DATABASE], str(folder), embedded=True, client=client)


#: a push's refusal of an embedded store another push is writing (`pushing`)
PUSHING = Refusals(
    held="store {folder} is being written by another push ({owner}); wait for that push to end, then push again "
         "(nothing was written; remove {path} if no push uses the store)",
    ownerless="store {folder} is locked by {path}, which names no push; remove {path} if no push uses the store, "
              "then push again (nothing was written)",
    subject="store {folder}",
    elsewhere="push into another store (--uri)",
    stuck="store {folder}: could not take {path}; remove it if no push uses the store, then push again")

#: a run's refusal of an embedded store a push is writing (`push_refusal`)
READING = Refusals(
    held="store {folder} is being written by a push ({owner}); wait for that push to end, then run again (remove "
         "{path} if no push uses the store)",
    ownerless="store {folder} is locked by {path}, which names no push; remove {path} if no push uses the store",
    subject="store {folder}", elsewhere="", stuck="")


@contextlib.contextmanager
def pushing(store: Store, waiting: Callable[[str], None] = print) -> Iterator[None]:
    """A push's hold on an embedded store: the folder's lock (`dane.records.lock.take_lock`) from before the push
    reads the store until it ends, so that a second push into the store, into any data set of it, is refused in one
    line naming the first (mongita's files take one writing process, and no reader while it writes); a dead push's
    lock is taken over.  Then the folder's ``flock``, exclusive, beside the shared one each read of a run holds
    (`reading`): a push that begins while a run reads waits for that read to end, saying so (``waiting``).  A server:
    nothing held (concurrent pushes into one data set there are not guarded)."""
    if not store.embedded:
        yield
        return
    lock = take_lock(Path(store.uri), PUSHING)
    try:
        with flocked(Path(store.uri), exclusive=True,
                     busy=lambda: waiting(f"push: a run is reading store {store.uri}; waiting for its read to end")):
            yield
    finally:
        lock.unlink(missing_ok=True)


def push_refusal(uri: str) -> str | None:
    """The line refusing a run on the store ``uri`` while a push writes it (its lock held by a live process, as
    `pushing` takes it), or None; a server: None."""
    return None if is_server(uri) else lock_refusal(Path(uri), READING)


def reading(uri: str) -> contextlib.AbstractContextManager:
    """A run's hold on the embedded store ``uri`` (a folder) during one read: the folder's ``flock``, shared, so that
    no push writes while it reads (`pushing` waits for it); one line, `push_refusal`'s, where a push holds the store
    (a push ending just then is waited for).  A server: nothing held."""
    if is_server(uri):
        return contextlib.nullcontext()

    def busy() -> None:
        refusal = push_refusal(uri)
        if refusal:
            raise DataError(refusal)

    return flocked(Path(uri), exclusive=False, busy=busy)


def fingerprint(paths: list[Path], options: dict) -> str:
    """SHA-256 of the source's bytes (every file, in order, with its name) and the push options."""
    digest = hashlib.sha256(repr(sorted(options.items())).encode())
    for path in paths:
        digest.update(str(path.name).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def column_fields(feature_names: list[str] | None, d: int) -> list[str]:
    """A document field per feature: its name where every name is a valid, distinct, unreserved MongoDB
    field name (no ``.``, no leading ``$``), else ``x0 .. x{d-1}``."""
    names = list(feature_names or [])
    good = (len(names) == d and len(set(names)) == d
            and all(n and "." not in n and not n.startswith("$") and n not in RESERVED and "\0" not in n
                    for n in names))
    return names if good else [f"x{j}" for j in range(d)]


# ------------------------------------------------------------------ upload
def row_documents(X, y: np.ndarray, columns: list[str], start: int, stop: int) -> list[dict]:
    """The documents of rows ``start .. stop-1`` (ids ``start+1 .. stop``): dense or sparse."""
    docs = []
    sparse = hasattr(X, "indptr")
    for row in range(start, stop):
        doc = {"_id": str(row + 1), "id": row + 1, "y": float(y[row])}
        if sparse:
            lo, hi = X.indptr[row], X.indptr[row + 1]
            doc["idx"], doc["val"] = X.indices[lo:hi].tolist(), X.data[lo:hi].tolist()
        else:
            doc.update(zip(columns, X[row].tolist()))
        docs.append(doc)
    return docs


def gridfs_documents(file_id: str, data: bytes, filename: str, metadata: dict) -> tuple[dict, list[dict]]:
    """GridFS's files document and chunks of ``data`` (``chunkSize`` `CHUNK_SIZE`)."""
    chunks = [{"_id": f"{file_id}:{n}", "files_id": file_id, "n": n, "data": data[at:at + CHUNK_SIZE]}
              for n, at in enumerate(range(0, max(len(data), 1), CHUNK_SIZE))]
    if not data:
        chunks = []
    files = {"_id": file_id, "length": len(data), "chunkSize": CHUNK_SIZE,
             "uploadDate": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0),
             "filename": filename, "metadata": metadata}
    return files, chunks


def read_gridfs(store: Store, bucket: str, file_ids: list[str]) -> dict[str, bytes]:
    """Every file's bytes, its chunks joined in ``n`` order and checked against ``length``."""
    lengths = {f["_id"]: int(f["length"]) for start in range(0, len(file_ids), IN_BATCH)
               for f in store.find(store.bucket(bucket, "files"), {"_id": {"$in": file_ids[start:start + IN_BATCH]}},
                                   ["_id", "length"])}
    pieces: dict[str, list[tuple[int, bytes]]] = {i: [] for i in lengths}
    for start in range(0, len(file_ids), IN_BATCH):
        for chunk in store.find(store.bucket(bucket, "chunks"), {"files_id": {"$in": file_ids[start:start + IN_BATCH]}},
                                ["files_id", "n", "data"]):
            pieces.setdefault(chunk["files_id"], []).append((int(chunk["n"]), bytes(chunk["data"])))
    out = {}
    for file_id in file_ids:
        parts = sorted(pieces.get(file_id, []))
        data = b"".join(p for _, p in parts)
        if file_id not in lengths or [n for n, _ in parts] != list(range(len(parts))) or len(data) != lengths[file_id]:
            raise DataError(f"{store.where(store.bucket(bucket, 'files'))}: GridFS file {file_id} is incomplete "
                            f"({len(data)} of {lengths.get(file_id, '?')} bytes); push the data again")
        out[file_id] = data
    return out


def unreadable(err: BaseException) -> bool:
    """Whether ``err`` is what reading a damaged store raises: BSON that does not decode (``InvalidBSON``: a data
    file cut short or overwritten), or mongita's check that a stored document has a length (its location lies past
    the end of a data file cut between documents).  Anything else is no sign of damage."""
    try:
        from bson.errors import BSONError  # PyMongo's, which mongita reads its files with
    except ImportError:  # no PyMongo: no store was read
        return False
    if isinstance(err, BSONError):
        return True
    if isinstance(err, AssertionError) and err.__traceback__ is not None:
        import traceback

        return "mongita" in Path(traceback.extract_tb(err.__traceback__)[-1].filename).parts
    return False


def drop(store: Store, name: str) -> None:
    """Drop data set ``name``: its samples, its GridFS bucket and its manifest."""
    for collection in (name, store.bucket(name, "files"), store.bucket(name, "chunks")):
        store.db.drop_collection(collection)
    store.db[MANIFEST].delete_one({"_id": name})


def drop_embedded_files(folder: str, name: str) -> None:
    """Remove an embedded store's files of data set ``name`` when the engine cannot read them (a push killed
    while mongita rewrote a collection's location index): mongita's folders of its samples and its bucket.
    Its manifest document, in a collection the engine still reads, is left to `drop`."""
    for collection in (name, f"{name}_files", f"{name}_chunks"):
        path = Path(folder) / f"{DATABASE}.{collection}"
        if path.is_dir():
            shutil.rmtree(path)
