"""``dane data push``: upload a table (CSV, LIBSVM, NPZ) or a folder of labelled images into a store.

The layout and the crash-safety protocol are `dane.data.mongo_store`'s. A push is idempotent: the
same source (same bytes, same options) into a complete data set (exactly ``n`` documents, sample ``i``
under ``_id`` ``"i"`` for i = 1..n) changes nothing; into a data set left ``uploading`` by a killed push
it completes it; into one that holds other documents too (a duplicate, a changed ``id``), those are
dropped and the missing samples uploaded again; a different source into a used name is refused
unless ``replace``, which drops the data set stored under the name, whatever it holds, and uploads
this one. A push into an embedded store holds its lock until it ends (`dane.data.mongo_store.pushing`):
another push into the store meanwhile is refused in one line. The table is read by the file sources
(`dane.data.files`) exactly as ``data=csv`` (or libsvm, npz) reads it with the same options, so a run on
the store sees the rows such a run sees.

A table read with a client column (``--client-column``: ``Table.clients``, one value per row, not a
feature) stores each row's value in the field ``client`` and the column's name in the manifest
(``client_column``), so ``data=mongo data.sharding=column`` deals the store as the file source deals
the file, from the ``(id, client)`` projection.

Images: ``FOLDER/<label>/<image>``, labels the sub-folder names in sorted order (0, 1, ...), samples in
(label, file name) order; each image's file bytes are stored unchanged in GridFS and decoded at read
time (Pillow), so the stored file is the one pushed. Every image is decoded once at push time too, as a run
decodes it (`check_images`): a file Pillow cannot read, or images of more than one shape, are refused in
one line before anything is uploaded.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from dane.data.mongo_store import (BATCH, CLIENT, IN_BATCH, MANIFEST, Store, column_fields, drop, drop_embedded_files,
                                   gridfs_documents, pushing, row_documents)
from dane.errors import DataError, brief, plural

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".pgm", ".ppm", ".tif", ".tiff")


def image_files(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """The label names (sub-folders, sorted) and every (image, label index), in (label, name) order."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    samples = [(f, k) for k, c in enumerate(classes) for f in sorted((folder / c).iterdir())
               if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES]
    if not samples:
        raise DataError(f"{folder} holds no images in sub-folders (FOLDER/<label>/<image>.png); "
                        "put each class's images in a folder named by its label")
    return classes, samples


def check_images(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """`image_files`, each decoded as a run decodes it (`decode_image`): one line naming the first file that does not
    decode, or the first whose shape is not the first image's (a run stacks them), before anything is uploaded."""
    classes, samples = image_files(folder)
    bad: list[tuple[Path, str]] = []
    shapes: dict[tuple, Path] = {}  # each shape met, and its first file
    for path, _ in samples:
        try:
            shapes.setdefault(decode_image(path.read_bytes()).shape, path)
        except UnreadableImage as err:
            bad.append((path, str(err)))
    if bad:
        path, reason = bad[0]
        others = f", nor are {len(bad) - 1} more of the {len(samples)} files in {folder}" if len(bad) > 1 else ""
        it = "them with images or remove them" if len(bad) > 1 else "it with an image or remove it"
        raise DataError(f"{path} is not an image Pillow can read ({reason}){others}; replace {it}, then push again "
                        "(nothing was uploaded)")
    if len(shapes) > 1:
        (shape, path), (other, first) = list(shapes.items())[1], list(shapes.items())[0]
        raise DataError(f"{path} has shape {shape}, not {other} as {first} ({len(shapes)} shapes in {folder}): a "
                        "run stacks the images, so they must be one size; resize them, then push again (nothing was "
                        "uploaded)")
    return classes, samples


def push_table(store: Store, name: str, table, *, print_fn: Callable[[str], None] = print,
               fingerprint_of: str = "", replace: bool = False, client_column: str | None = None) -> str:
    """Upload ``table`` (a `dane.data.table.Table`) as data set ``name``; returns what was done (one line).
    ``client_column``: the name of the column ``table.clients`` was read from (required with them)."""
    sparse = hasattr(table.X, "indptr")
    columns = [] if sparse else column_fields(table.feature_names, table.d)
    manifest = {"_id": name, "state": "uploading", "n": table.n, "kind": "sparse" if sparse else "dense",
                "d": table.d, "columns": columns, "feature_names": list(table.feature_names or []),
                "classes": [], "fingerprint": fingerprint_of, "source": table.name}
    clients = None
    if table.clients is not None:
        assert client_column, f"{table.name}: clients without the name of their column"
        manifest.update(client_column=client_column, client_field=CLIENT)
        clients = np.asarray(table.clients).tolist()  # Python ints, floats or str: BSON takes no NumPy scalars

    def write(start: int, stop: int) -> None:
        docs = row_documents(table.X, table.y, columns, start, stop)
        if clients is not None:
            for doc, client in zip(docs, clients[start:stop]):
                doc[CLIENT] = client
        store.db[name].insert_many(docs)

    return _push(store, name, manifest, write, print_fn=print_fn, replace=replace)


def push_images(store: Store, name: str, folder: Path, *, print_fn: Callable[[str], None] = print,
                fingerprint_of: str = "", replace: bool = False, checked: bool = False) -> str:
    """Upload the labelled images of ``folder`` as data set ``name`` (bytes in GridFS bucket ``name``), each checked
    first (`check_images`; ``checked``: the caller has just done so)."""
    classes, samples = image_files(folder) if checked else check_images(folder)
    manifest = {"_id": name, "state": "uploading", "n": len(samples), "kind": "images", "d": 0, "columns": [],
                "feature_names": [], "classes": classes, "fingerprint": fingerprint_of, "source": str(folder)}

    def write(start: int, stop: int) -> None:
        rows = []
        for i in range(start, stop):
            path, label = samples[i]
            sample = i + 1
            relative = f"{classes[label]}/{path.name}"
            files, chunks = gridfs_documents(str(sample), path.read_bytes(), relative, {"id": sample, "label": label})
            if chunks:
                store.db[store.bucket(name, "chunks")].insert_many(chunks)
            store.db[store.bucket(name, "files")].insert_one(files)
            rows.append({"_id": str(sample), "id": sample, "y": float(label), "file_id": str(sample),
                         "filename": relative})
        store.db[name].insert_many(rows)

    return _push(store, name, manifest, write, print_fn=print_fn, replace=replace)


def _push(store: Store, name: str, manifest: dict, write, *, print_fn, replace: bool) -> str:
    """`_upload`, holding an embedded store's lock throughout (`dane.data.mongo_store.pushing`): a second push into
    the store meanwhile is refused in one line, before it reads or writes anything."""
    with pushing(store, print_fn):
        return _upload(store, name, manifest, write, print_fn=print_fn, replace=replace)


def _upload(store: Store, name: str, manifest: dict, write, *, print_fn, replace: bool) -> str:
    """The protocol of `dane.data.mongo_store`: fresh, already complete, resumed, or redone."""
    n = manifest["n"]
    try:
        old = store.manifest(name)
        present, stray = _scan(store, name, n) if old is not None else (set(), [])
    except Exception as err:  # the engine cannot read what a killed push left: drop it and start again
        if not store.embedded:
            raise
        print_fn(f"push: {store.where(name)} cannot be read back ({type(err).__name__}); dropping it and "
                 "uploading again")
        drop_embedded_files(store.uri, name)
        from dane.data.mongo_store import connect

        store = connect(store.uri, create=True)
        drop(store, name)
        old, present, stray = None, set(), []
    if old is not None and (replace or old.get("fingerprint") != manifest["fingerprint"]):
        if not replace:
            same = old.get("source") == manifest.get("source")  # the same file, its rows or this push's options changed
            what = (f"an earlier push of {old.get('source')} whose rows or options differ from this one's" if same
                    else f"another data set ({old.get('source')})")
            raise DataError(f"{store.where(name)} holds {what}; push into another --collection, or add --replace to "
                            "drop it and upload this one")
        drop(store, name)
        old, present, stray = None, set(), []
    if old is not None and old.get("state") == "complete" and old.get("n") == n and len(present) == n and not stray:
        return f"{store.where(name)} already holds the {plural(n, 'sample')} (complete); nothing to do"
    if old is None:
        drop(store, name)  # pieces of a data set whose manifest never got written
        store.db[MANIFEST].insert_one(manifest)
        action = "uploaded"
    elif old.get("state") == "complete":  # a reader refuses it: documents added, lost or changed since
        store.db[MANIFEST].update_one({"_id": name}, {"$set": {"state": "uploading"}})
        action = (f"repaired (dropped {len(stray)} document(s) other than samples 1..{n}; found {len(present)} of "
                  f"{plural(n, 'sample')})")
    else:
        action = f"completed (found {len(present)} of {plural(n, 'sample')} from an interrupted push)"
    for start in range(0, len(stray), IN_BATCH):
        store.db[name].delete_many({"_id": {"$in": stray[start:start + IN_BATCH]}})
    store.db[name].create_index([("id", 1)])
    if manifest["kind"] == "images":
        _drop_orphans(store, name, present)
    missing = [i for i in range(1, n + 1) if i not in present]
    for start, stop in _runs(missing):
        for at in range(start, stop, BATCH):
            write(at - 1, min(at + BATCH, stop) - 1)
    stored, stray = _scan(store, name, n)
    if stray or stored != set(range(1, n + 1)):
        raise DataError(f"{store.where(name)} holds {len(stored) + len(stray)} documents after the push, not samples "
                        f"1..{n}; push again with --replace")
    store.db[MANIFEST].update_one({"_id": name}, {"$set": {"state": "complete", "push_id": uuid.uuid4().hex}})
    return f"{action} {plural(n, 'sample')} into {store.where(name)}"


def _scan(store: Store, name: str, n: int) -> tuple[set[int], list]:
    """The ids of the samples stored as a push writes them (sample ``i`` under ``_id`` ``"i"``, 1 <= i <= n), and
    the ``_id`` of every other document (a duplicate of a sample, a changed or missing ``id``): a reader refuses
    a data set holding any."""
    present, stray = set(), []
    for doc in store.find(name, {}, ["_id", "id"]):
        i = doc.get("id")
        if type(i) is int and 1 <= i <= n and doc["_id"] == str(i):
            present.add(i)
        else:
            stray.append(doc["_id"])
    return present, stray


def _drop_orphans(store: Store, name: str, present: set[int]) -> None:
    """GridFS pieces of samples without a sample document: a push was killed between them."""
    for part, key in (("files", "_id"), ("chunks", "files_id")):
        bucket = store.bucket(name, part)
        orphans = sorted({doc[key] for doc in store.find(bucket, {}, [key])} - {str(i) for i in present})
        if orphans:
            store.db[bucket].delete_many({key: {"$in": orphans}})


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as [start, stop) runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


class UnreadableImage(ValueError):
    """Bytes Pillow cannot decode as an image; the message says why (the caller names the file)."""


def decode_image(data: bytes) -> np.ndarray:
    """An image file's pixels as a uint8 array (H x W, or H x W x C), as Pillow reads it; `UnreadableImage` for
    bytes it cannot decode (not an image, a truncated one)."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image)
    except UnidentifiedImageError:
        raise UnreadableImage("not an image file Pillow knows") from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
        raise UnreadableImage(f"{type(err).__name__}: {brief(err, 80)}") from None
