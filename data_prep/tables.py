"""Table-shaped inputs: parquet files, CSV and TSV files (also .gz/.zst), and folders written by
`datasets`' ``save_to_disk``; the documents are one text column of each (``--text_field``).

CSV and TSV were read as text before (issue 55's second pass): the header and the quoting went
into the vocabulary and the shards, one document per blank-line block. Now a CSV/TSV file needs
a header row naming its columns, quoted fields may hold newlines and delimiters (RFC 4180, as
pyarrow's CSV reader parses them), and a row with another number of fields than the header is
skipped and counted (``csv_bad_row``, with its line) like any other bad record.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from bertforge.data_prep.compressed import open_binary
from bertforge.data_prep.input_checks import InputError

#: a file's last suffix (before .gz/.zst) -> its table kind
TABLE_KINDS = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv"}
_DELIMITER = {"csv": ",", "tsv": "\t"}
_CSV_BLOCK = 1 << 20  # bytes pyarrow parses at once: a row must fit in one block


class Drops(Protocol):
    """Where bad records are counted (:class:`data_prep.inputs.DropCounter`)."""

    def drop(self, reason: str, where: str, detail: str) -> None: ...


def table_documents(
    path: Path, kind: str, compression: str | None, field: str, drops: Drops
) -> Iterator[tuple[str, str]]:
    """(text, "FILE row N") of every row of a parquet, CSV or TSV file."""
    if kind == "parquet":
        yield from _parquet_documents(path, field, drops)
    else:
        yield from _csv_documents(path, kind, compression, field, drops)


def _csv_documents(
    path: Path, kind: str, compression: str | None, field: str, drops: Drops
) -> Iterator[tuple[str, str]]:
    # Lazy: pyarrow only for table inputs.
    import pyarrow as pa
    import pyarrow.csv as pacsv

    def bad_row(row) -> str:
        # pyarrow knows no line number where quoted fields may hold newlines: the row's text
        # then says which row it was
        drops.drop(
            "csv_bad_row",
            f"{path}:{row.number}" if row.number is not None else str(path),
            f"{row.actual_columns} fields where the header has {row.expected_columns}: "
            f"{row.text[:80]!r}",
        )
        return "skip"

    with open_binary(path, compression) as stream:
        try:
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(block_size=_CSV_BLOCK),
                parse_options=pacsv.ParseOptions(
                    delimiter=_DELIMITER[kind],
                    newlines_in_values=True,
                    invalid_row_handler=bad_row,
                ),
                convert_options=pacsv.ConvertOptions(column_types={field: pa.string()}),
            )
        except pa.ArrowInvalid as e:
            raise InputError(
                f"{path}: not a readable {kind.upper()} file ({e}); it needs a header row naming "
                "its columns"
            ) from None
        names = reader.schema.names
        if field not in names:
            raise InputError(
                f"{path}: no column {field!r} in its header (columns: {names}); pass "
                "--text_field COLUMN."
            )
        at = names.index(field)
        batches = (batch.column(at).to_pylist() for batch in reader)
        yield from _column_documents(batches, str(path), drops)


def _column_documents(
    batches: Iterator[list], where: str, drops: Drops
) -> Iterator[tuple[str, str]]:
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # pyarrow raises several types for a damaged row group
            drops.drop(
                "corrupt_file",
                f"{where} row {row + 1}",
                f"unreadable from here ({type(e).__name__}: {e}); the {row} rows before are "
                "kept, the rest of the file is lost. Re-create or re-download it to keep it",
            )
            return
        for text in batch:
            row += 1
            if text is None:
                drops.drop("null_text", f"{where} row {row}", "value is null")
            elif not isinstance(text, str):
                drops.drop("column_not_text", f"{where} row {row}", f"{type(text).__name__} value")
            elif not text.strip():
                drops.drop("empty_document", f"{where} row {row}", "empty text")
            else:
                yield text.strip(), f"{where} row {row}"


def _parquet_documents(path: Path, field: str, drops: Drops) -> Iterator[tuple[str, str]]:
    # Lazy: pyarrow only for parquet inputs.
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        drops.drop(
            "corrupt_file",
            str(path),
            f"not a readable parquet file ({type(e).__name__}: {e}); re-create or re-download it",
        )
        return
    names = pf.schema_arrow.names
    if field not in names:
        raise InputError(
            f"{path}: no column {field!r} (columns: {names}); pass --text_field COLUMN."
        )
    batches = (b.column(0).to_pylist() for b in pf.iter_batches(batch_size=1024, columns=[field]))
    yield from _column_documents(batches, str(path), drops)


def hf_documents(path: Path, field: str, drops: Drops) -> Iterator[tuple[str, str]]:
    """(text, "FOLDER[/SPLIT] row N") of every row of a saved Hugging Face dataset (every split
    of a DatasetDict, by name)."""
    # Lazy: datasets takes seconds to import; only saved Hugging Face datasets need it.
    import datasets

    loaded = datasets.load_from_disk(str(path))
    parts = (
        [(name, loaded[name]) for name in sorted(loaded)]
        if isinstance(loaded, datasets.DatasetDict)
        else [("", loaded)]
    )
    for name, ds in parts:
        if field not in ds.column_names:
            raise InputError(
                f"{path}{'/' + name if name else ''}: no column {field!r} "
                f"(columns: {ds.column_names}); pass --text_field COLUMN."
            )
        batches = (b[field] for b in ds.select_columns([field]).iter(1024))
        yield from _column_documents(batches, f"{path}{'/' + name if name else ''}", drops)
