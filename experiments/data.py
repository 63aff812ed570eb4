"""``dane data push``: upload a data set into a MongoDB store, for ``data=mongo`` runs.

    dane data push admissions.csv --target admit --categorical rank --uri stores/demo --collection admissions
    dane data push a9a.svm --uri mongodb://localhost:27017/dane --collection a9a
    dane data push features.npz --uri stores/demo --collection features
    dane data push images/ --uri stores/demo --collection shapes       # images/<label>/<image>.png
    dane data push adult_like.csv --target income --categorical education sex --client-column workclass \\
        --uri stores/demo --collection adult

The format is the file's suffix (``.csv``, ``.npz``, anything else LIBSVM) or a folder of images. A
table is read by the source ``data=csv|libsvm|npz`` would use, with the options given here, so a
``data=mongo`` run sees the rows such a run sees (``--standardize``: none by default, the rows as in
the file; ``--drop``: CSV columns left out, as ``data.drop``). ``--uri``: a ``mongodb://`` server, or a folder
for an embedded store (made if absent; relative: from the working folder, where a run started with the same
``data.uri`` finds it).
The push is idempotent and completes an interrupted one (`dane.data.mongo_push`).
``--client-column NAME`` (a CSV header, an ``.npz`` key, ``qid`` for LIBSVM) reads that column as
``data.sharding=column data.client_column=NAME`` does: each row's value is stored in the field
``client`` (not a feature), for ``data=mongo data.sharding=column data.client_column=NAME``.
``--x-key``, ``--y-key``: an ``.npz`` archive's arrays, as ``data.x_key``, ``data.y_key``. An image
folder's images are each decoded before anything is uploaded (`dane.data.mongo_push.check_images`).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from dane.errors import UserError, say


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dane data", description="Upload a data set into a MongoDB store.")
    sub = p.add_subparsers(dest="command", required=True)
    push = sub.add_parser("push", help="a CSV, LIBSVM or NPZ table, or a folder of labelled images")
    push.add_argument("source", help="the file (by its suffix: .csv, .npz, any other LIBSVM), or a folder "
                      "FOLDER/<label>/<image>")
    push.add_argument("--uri", required=True, help="mongodb://HOST[:PORT]/DATABASE, or a folder (embedded store; "
                      "relative: from the working folder, as a run's data.uri)")
    push.add_argument("--collection", required=True, help="the data set's name in the store")
    push.add_argument("--target", help="CSV: the label column")
    push.add_argument("--categorical", nargs="*", default=[], help="CSV: columns to one-hot encode")
    push.add_argument("--drop", nargs="*", default=[], help="CSV: columns left out (an ID, a name), as data.drop")
    push.add_argument("--delimiter", default=",", help="CSV: one character ('\\t': a tab)")
    push.add_argument("--client-column", help="a table's client column (a CSV header, an .npz key, qid for "
                      "LIBSVM), stored per row, not a feature: for data.sharding=column")
    push.add_argument("--x-key", help="NPZ: the features' array (default X), as data.x_key")
    push.add_argument("--y-key", help="NPZ: the labels' array (default y), as data.y_key")
    push.add_argument("--standardize", default="none", help="numeric | all | none (default: none)")
    push.add_argument("--data-dir", default=os.environ.get("DANE_DATA_DIR", "../shared/data"),
                      help="where a relative source is looked for first, then the working folder, as a run's "
                           "data_dir (default: %(default)s, from the repository root)")
    push.add_argument("--replace", action="store_true", help="drop the data set stored under the name, whatever it "
                      "holds, and upload this one")
    return p


def read_table(args):
    """The table the file source of ``args.source``'s format reads, and the push's fingerprint options."""
    from dane.data.files import CSVSource, LibSVMSource, NPZSource

    path = Path(args.source).resolve()
    options = {"standardize": args.standardize}
    if args.client_column is not None:  # only then: the fingerprints of pushes without one stay as they were
        options["client_column"] = args.client_column
    keys = {"sharding": "column"} if args.client_column is not None else {}
    arrays = {k: v for k, v in (("x_key", args.x_key), ("y_key", args.y_key)) if v is not None}
    csv_only = [f"--{k}" for k, given in (("target", args.target), ("categorical", args.categorical),
                                          ("drop", args.drop), ("delimiter", args.delimiter != ",")) if given]
    if csv_only and path.suffix.lower() != ".csv":  # it was ignored (a .tsv read as LIBSVM said 'not LIBSVM')
        kind = "an .npz archive" if path.suffix.lower() == ".npz" else "LIBSVM"
        raise UserError(f"dane data push {args.source}: {csv_only[0]} is a CSV option, but this file is read as {kind} "
                        f"(the format is the suffix: .csv, .npz, any other LIBSVM); push it without "
                        f"{' '.join(csv_only)}, or a CSV table under a name ending in .csv")
    if arrays and path.suffix.lower() != ".npz":
        raise UserError(f"dane data push {args.source}: --{next(iter(arrays)).replace('_', '-')} names an array of an "
                        ".npz archive; this is not one (push it without it)")
    options.update(arrays)  # only when given: the fingerprints of pushes without them stay as they were
    if path.suffix.lower() == ".csv":
        if not args.target:
            raise UserError(f"dane data push {args.source}: a CSV needs --target COLUMN (the label column)")
        options.update(target=args.target, categorical=tuple(args.categorical), delimiter=args.delimiter)
        if args.drop:  # only when given: the fingerprints of pushes without it stay as they were
            options["drop"] = tuple(args.drop)
        source = CSVSource(str(path), **options, **keys)
        options["delimiter"] = source.delimiter  # '\t' as typed is the tab read with
    elif path.suffix.lower() == ".npz":
        source = NPZSource(str(path), **options, **keys)
    else:
        source = LibSVMSource(str(path), **options, **keys)
    return source.load(), options


def push(args) -> str:
    from dane.data.mongo_push import push_images, push_table
    from dane.data.mongo_store import (EMBEDDED_NAME_MAX, MANIFEST, connect, fingerprint, is_server, location,
                                       name_problem)
    from dane.data.mongo_source import MongoSource
    from dane.data.table import resolve_dir

    problem = name_problem(args.collection, embedded=not is_server(args.uri))
    if problem:
        suggestion = re.sub(r"[^A-Za-z0-9_-]+", "_", args.collection).strip("_")[:EMBEDDED_NAME_MAX].strip("_")
        raise UserError(f"--collection {args.collection!r}: {problem}; choose another name (letters, digits, '_' and "
                        f"'-'){f', e.g. --collection {suggestion}' if suggestion not in ('', MANIFEST) else ''}")
    MongoSource(uri=args.uri, collection=args.collection)  # the same checks of the URI a run makes
    given = Path(args.source).expanduser()
    tried = [given] if given.is_absolute() else [*([resolve_dir(args.data_dir) / given] if args.data_dir else []),
                                                 Path.cwd() / given]
    path = next((p for p in tried if p.exists()), None)
    if path is None:
        raise UserError(f"dane data push: {args.source} not found (tried {', '.join(map(str, tried))}); give a CSV, "
                        "LIBSVM or NPZ file, or a folder of images FOLDER/<label>/<image>, or --data-dir FOLDER")
    args.source = str(path)  # `read_table` reads what was found
    uri = location(args.uri)  # a relative folder from the working folder, as a run's data.uri
    if path.is_dir():
        from dane.data.mongo_push import check_images

        if args.client_column is not None:
            raise UserError(f"dane data push {args.source}: --client-column names a column of a table; an image "
                            "folder has none (push it without --client-column)")

        files = [f for f, _ in check_images(path)[1]]  # every image decoded, before the store is touched
        stamp = fingerprint(files, {"images": [str(f.relative_to(path)) for f in files]})
        return push_images(connect(uri, create=True), args.collection, path, fingerprint_of=stamp,
                           replace=args.replace, checked=True)
    table, options = read_table(args)  # the file read and checked, before the store is touched
    store = connect(uri, create=True)
    stamp = fingerprint([path], options)
    return push_table(store, args.collection, table, fingerprint_of=stamp, replace=args.replace,
                      client_column=args.client_column)


#: the data keys a source's message names, as this command's flags (a source's checks speak of a run's config)
FLAGS = ((re.compile(r"data\.(categorical|drop)=\[([^\]]*)\]"), lambda m: f"--{m[1]} " + m[2].replace(",", " ")),
         (re.compile(r"\bdata\.(target|categorical|drop|delimiter|standardize|client_column|uri|collection|x_key|"
                     r"y_key)\b"),
          lambda m: "--" + m[1].replace("_", "-")),
         (re.compile(r"\bdata\.path\b"), lambda m: "the path given"))


def as_flags(message: str) -> str:
    """``message`` with the data keys it names written as ``dane data push``'s flags."""
    for pattern, flag in FLAGS:
        message = pattern.sub(flag, message)
    return message


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(push(args))
    except UserError as err:
        say(f"error: {as_flags(str(err))}")
        sys.exit(2)


if __name__ == "__main__":
    main()
