"""Helpers for examples/data_preprocess/: read datasets as distributed, write rows in our parquet format."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from verl_like.data.rows import check_record

logger = logging.getLogger(__name__)

SOURCE_SUFFIXES = (".json", ".jsonl", ".parquet")


def _read_json(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        # Some distributions name JSON-lines files .json.
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(value, dict):
        return [value]  # MATH's original layout: one problem per file
    if isinstance(value, list):
        return value
    raise ValueError(f"{path}: a JSON {type(value).__name__}; expected an object, a list of objects or JSON lines")


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return _read_json(path)


def source_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The data files named by `paths`; a folder stands for every .json/.jsonl/.parquet file under it, sorted."""
    files: list[Path] = []
    for entry in paths:
        path = Path(entry).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())
            if not found:
                raise FileNotFoundError(f"{path}: no {'/'.join(SOURCE_SUFFIXES)} files in this folder")
            files.extend(found)
        elif path.is_file():
            if path.suffix not in SOURCE_SUFFIXES:
                raise ValueError(f"{path}: unsupported input type {path.suffix!r}; give {SOURCE_SUFFIXES} files")
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder; pass the dataset files you downloaded")
    return files


def read_source_records(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Every record of every file in `paths` (json, jsonl, parquet, or folders of them), in order."""
    records: list[dict[str, Any]] = []
    for path in source_files(paths):
        records.extend(_read_file(path))
    return records


def write_rows(rows: list[dict[str, Any]], output: str | os.PathLike) -> Path:
    """Checks `rows` with the dataset's row checks and writes them to `output` (.parquet or .jsonl) atomically."""
    output = Path(output)
    if output.suffix not in (".parquet", ".jsonl"):
        raise ValueError(f"output {output}: use a .parquet or .jsonl file name")
    if not rows:
        raise ValueError(f"no rows to write to {output}")
    for index, row in enumerate(rows):
        check_record(row, str(output), index)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    try:
        if output.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), tmp)
        else:
            Path(tmp).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    logger.info("wrote %d rows to %s", len(rows), output)
    return output


def conversion_main(
    convert: Callable[[dict[str, Any], str, int], dict[str, Any]], description: str, argv: Sequence[str] | None = None
) -> Path:
    """The command line of a preprocessing script: `--input` files/folders, `--split`, `--output`; each record
    goes through `convert(record, split, index)`. Returns the written file."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, help=".json/.jsonl/.parquet files or folders of them")
    parser.add_argument("--split", required=True, help="split name stored in extra_info (train, test)")
    parser.add_argument("--output", required=True, help="output .parquet or .jsonl file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records = read_source_records(args.input)
    return write_rows([convert(record, args.split, i) for i, record in enumerate(records)], args.output)
