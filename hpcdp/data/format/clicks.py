"""Check a click file before training on it: its layout, then every id and label.

A bad id would otherwise surface as an index error deep inside an embedding
lookup on one rank, mid-epoch, while the other ranks wait in a collective. So
the checks here run on every rank before the first collective and raise
`ReaderError` naming the file, the field and the rows.

`read_schema` checks the layout (cheap); `check_rows` scans the values of a row
range in chunk-aligned slabs (about the cost of reading that range once).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import h5py
import numpy as np

from hpcdp.data.format.samples import ReaderError, open_h5, validate_dataset

FIELDS = ("dense", "sparse", "label")
#: Rows checked per read (rounded to whole chunks).
SCAN_ROWS = 1 << 16


@dataclass(frozen=True)
class ClickSchema:
    """What a model and a reader need to know about a click file."""

    path: str
    num_samples: int
    dense_features: int
    table_sizes: tuple[int, ...]
    field_names: tuple[str, ...]
    block: int  # rows per chunk of the sparse dataset

    @property
    def num_fields(self) -> int:
        return len(self.table_sizes)


def read_schema(path: str | os.PathLike[str]) -> ClickSchema:
    """The file's click layout; `ReaderError` naming the file and the problem."""
    path = os.fspath(path)
    infos = {name: validate_dataset(path, name, None) for name in FIELDS}
    n = infos["dense"].num_samples
    for name, info in infos.items():
        if info.num_samples != n:
            raise ReaderError(f"{path}: field {name!r} has {info.num_samples} rows but 'dense' "
                              f"has {n}")
    with open_h5(path) as f:
        if "table_sizes" not in f.attrs:
            raise ReaderError(f"{path}: no attribute 'table_sizes' (the rows of each field's "
                              "table); write click files with datasets/clicks.py")
        sizes = tuple(int(s) for s in np.atleast_1d(f.attrs["table_sizes"]))
        names_attr = f.attrs.get("field_names")
        names = (tuple(json.loads(names_attr)) if names_attr is not None
                 else tuple(f"field_{j}" for j in range(len(sizes))))
    _check_shapes(path, infos, sizes, names)
    return ClickSchema(path, n, infos["dense"].sample_shape[0], sizes, names,
                       infos["sparse"].block)


def _check_shapes(path: str, infos: dict, sizes: tuple[int, ...], names: tuple[str, ...]) -> None:
    dense, sparse, label = (infos[k] for k in FIELDS)
    if len(dense.sample_shape) != 1 or dense.dtype.kind != "f":
        raise ReaderError(f"{path}: field 'dense' must be (rows, features) floats, got "
                          f"{(dense.num_samples, *dense.sample_shape)} {dense.dtype}")
    if sparse.sample_shape != (len(sizes),) or sparse.dtype.kind not in "iu":
        raise ReaderError(f"{path}: field 'sparse' must be (rows, {len(sizes)}) integer ids "
                          f"(one per table in 'table_sizes'), got "
                          f"{(sparse.num_samples, *sparse.sample_shape)} {sparse.dtype}")
    if label.sample_shape != ():
        raise ReaderError(f"{path}: field 'label' must be one label per row, got shape "
                          f"{(label.num_samples, *label.sample_shape)}")
    if len(names) != len(sizes):
        raise ReaderError(f"{path}: {len(names)} field names for {len(sizes)} tables")
    bad = [(names[j], s) for j, s in enumerate(sizes) if s < 1]
    if bad:
        raise ReaderError(f"{path}: table of field {bad[0][0]!r} has {bad[0][1]} rows")


def check_rows(schema: ClickSchema, start: int = 0, stop: int | None = None) -> None:
    """Every id in its table, every label 0 or 1, every dense value finite, in [start, stop).

    Raises `ReaderError` naming the file, the field, the slab of rows and the first
    bad row. To share the work, each rank may check a part and agree on the result
    (a collective); checking the whole file on every rank needs no collective.
    """
    stop = schema.num_samples if stop is None else stop
    if not 0 <= start <= stop <= schema.num_samples:
        raise ReaderError(f"{schema.path}: rows [{start}, {stop}) outside 0..{schema.num_samples}")
    step = schema.block * max(1, SCAN_ROWS // schema.block)
    with open_h5(schema.path) as f:
        dsets = {name: f[name] for name in FIELDS}
        a = start
        while a < stop:
            b = min(stop, (a // step + 1) * step)
            _check_slab(schema, dsets, a, b)
            a = b


def _where(schema: ClickSchema, a: int, b: int, row: int) -> str:
    return f"in rows [{a}, {b}) of {schema.path} (first at row {row})"


def _check_slab(schema: ClickSchema, dsets: dict[str, h5py.Dataset], a: int, b: int) -> None:
    sizes = np.asarray(schema.table_sizes, np.int64)
    ids = np.asarray(dsets["sparse"][a:b], np.int64)
    bad = (ids < 0) | (ids >= sizes)
    if bad.any():
        r, j = (int(v) for v in np.argwhere(bad)[0])
        value = int(ids[r, j])
        why = "negative" if value < 0 else f"outside its table of {sizes[j]} rows"
        raise ReaderError(f"field {schema.field_names[j]!r} (column {j} of 'sparse'): id {value} "
                          f"is {why}, {_where(schema, a, b, a + r)}")
    label = np.asarray(dsets["label"][a:b])
    bad_label = (label != 0) & (label != 1)
    if bad_label.any():
        r = int(np.argmax(bad_label))
        raise ReaderError(f"field 'label': {label[r].item()} is not 0 or 1, "
                          f"{_where(schema, a, b, a + r)}")
    dense = np.asarray(dsets["dense"][a:b])
    finite = np.isfinite(dense)
    if not finite.all():
        r, j = (int(v) for v in np.argwhere(~finite)[0])
        raise ReaderError(f"field 'dense' (feature {j}): {dense[r, j]} is not finite, "
                          f"{_where(schema, a, b, a + r)}")


def validate_click_file(path: str | os.PathLike[str]) -> ClickSchema:
    """Layout and every value of a click file; the schema when all is well."""
    schema = read_schema(path)
    check_rows(schema)
    return schema
