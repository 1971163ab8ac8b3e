"""Loading jsonl / parquet / `datasets` rows into Examples, validating every row.

A source is a `.jsonl` (or JSON Lines `.json`) file, a `.parquet` file, a directory written
by `datasets` (`save_to_disk`; of a `DatasetDict`, the named split), or a Hugging Face hub
name, read by `datasets.load_dataset(name, split=...)` (needs the network, and `datasets`).

A malformed row (broken JSON, not an object, a missing field, a field of the wrong type, an
empty answer, or a task-specific problem raised by the converter) is an error that names the
file and line: `data/train.jsonl:17: field 'answer' is empty`. With `skip_invalid=True` the
row is skipped instead, and the count and the first few reasons are kept on the `Dataset`.

Example ids are `<file name>:<line>` (1-based; for parquet and `datasets`, the 1-based row
number, after `/<split>` when the source has splits), so a reward log can always be traced
back to its source row.

A JSON number with a fraction or exponent is read as a `NumberText`: a float whose `str` is
the text the file wrote, so an answer stored as `27.0` or `1.50` compares as that text, not
as Python's rendering of the parsed float.

A row fails however its parse fails (RecursionError on deeply nested JSON, ValueError on
an integer longer than Python's int-string limit, any exception a converter raises): always
as a row error naming `file:line`, never as a bare exception.

A `.json` file must be JSON Lines too: one holding a single JSON document (an array of rows,
or an object spread over lines) is refused as a whole, naming the file and how to convert it,
rather than reported as broken lines. A line that is not UTF-8 is a row error with its line.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from locojax.envs.base import Example


class NumberText(float):
    """A float parsed from JSON that remembers its source text: `str(NumberText("1.50"))` is
    "1.50", where `str(1.50)` would be "1.5"."""

    __slots__ = ("text",)

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = str(text)
        return obj

    def __str__(self) -> str:
        return self.text

    def __getnewargs__(self):  # pickles (e.g. to reward worker processes) keep the text
        return (self.text,)


class DataError(ValueError):
    """A row or file that cannot be turned into an Example."""


class RowError(ValueError):
    """Raised by a converter for a task-specific problem; `load_examples` adds file and line."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Examples loaded from one file, plus what was skipped on the way."""

    examples: tuple[Example, ...]
    """The valid rows, in file order."""
    source: str = ""
    """The file they came from."""
    skipped: int = 0
    """Rows dropped because they were invalid (only with skip_invalid=True)."""
    problems: tuple[str, ...] = ()
    """The reasons of the first skipped rows, `file:line: reason`."""

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)


MAX_PROBLEMS_KEPT = 20
_MAX_DOCUMENT_BYTES = 256 << 20  # a file this size may be re-read whole to name its format

Converter = Callable[[Mapping[str, Any], str], Example]
"""(validated row, example id) -> Example; raises RowError for task-specific problems."""


def is_hub_name(path: str) -> bool:
    """`org/name` or `name` with no such local path and no file extension: a hub dataset."""
    return (not os.path.exists(path) and not os.path.splitext(path)[1]
            and path.count("/") <= 1 and not path.startswith((".", "/")) and bool(path))


def _datasets_rows(path: str, split: str | None) -> tuple[Any, str | None]:
    """The rows of a `datasets` directory or hub name, and the split they came from (None
    for a directory holding one `Dataset`)."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a datasets directory or hub name needs the "
                        "`datasets` package (pip install datasets)") from None
    if not os.path.isdir(path):
        try:
            return datasets.load_dataset(path, split=split or "train"), split or "train"
        except Exception as e:  # noqa: BLE001 - datasets raises many types
            raise DataError(f"{path}: no such file or directory, and not a hub dataset "
                            f"datasets can load ({_reason(e)})") from e
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: not a directory datasets wrote with save_to_disk "
                        f"({_reason(e)})") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: has no split {split!r} (splits: {', '.join(ds)}); name "
                            "one with --task.split / --task.test-split")
        return ds[split], split
    return ds, None


def has_split(path: str | os.PathLike, split: str) -> bool:
    """Whether `path` is a `datasets` directory of a `DatasetDict` holding `split` (files and
    hub names: False; a hub name's splits would need the network to list)."""
    index = os.path.join(os.fspath(path), "dataset_dict.json")
    if not os.path.isfile(index):
        return False
    with open(index) as f:
        return split in json.load(f).get("splits", [])


def read_rows(path: str | os.PathLike, split: str | None = None
              ) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) for each non-blank line of a .jsonl, each row of a .parquet
    or each row of a `datasets` directory or hub name (`split`: which one of several).

    A line that is not valid JSON, or not UTF-8, yields a DataError instance in place of the
    row, so the caller decides whether to raise or skip it; a file that holds one JSON
    document instead of JSON Lines raises.
    """
    path = os.fspath(path)
    if os.path.isdir(path) or is_hub_name(path):
        rows, _ = _datasets_rows(path, split)
        yield from enumerate(rows, start=1)
        return
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for corrupt files
            raise DataError(f"{path}: cannot read parquet: {e}") from e
        yield from enumerate(rows, start=1)
        return
    if not (path.endswith(".jsonl") or path.endswith(".json")):
        raise DataError(f"{path}: unsupported format (expected .jsonl, .parquet, a datasets "
                        "directory or a hub name)")
    first = True
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield line_no, DataError(f"not UTF-8 ({e.reason} at byte {e.start} of the line)")
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_float=NumberText)
            except json.JSONDecodeError as e:
                kind = _json_document(path) if first else None
                if kind is not None:
                    raise DataError(_document_error(path, array=kind == "array")) from None
                row = DataError(f"broken JSON line ({e.msg} at column {e.colno})")
            except RecursionError:
                row = DataError("JSON nested too deeply to parse")
            except Exception as e:  # noqa: BLE001 - e.g. ValueError: a 5000-digit integer
                row = DataError(f"cannot parse the line ({_reason(e)})")
            else:  # a whole array of rows on one line
                if first and isinstance(row, list) and row and all(
                        isinstance(r, dict) for r in row):
                    raise DataError(_document_error(path, array=True))
            first = False
            yield line_no, row


def _json_document(path: str) -> str | None:
    """"array" or "value" when the whole file parses as one JSON document (pretty-printed),
    else None."""
    if os.path.getsize(path) > _MAX_DOCUMENT_BYTES:
        return None
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except Exception:  # noqa: BLE001 - not one document, however it fails (RecursionError...)
        return None
    return "array" if isinstance(doc, list) else "value"


def _reason(e: BaseException) -> str:
    """`Type: message`, short, for a row error."""
    return f"{type(e).__name__}: {str(e)[:200]}"


def _document_error(path: str, array: bool) -> str:
    what = "a JSON array of rows" if array else "one JSON value spread over several lines"
    msg = (f"{path}: holds {what}, but locojax reads JSON Lines (each row a JSON object on "
           "its own line, whatever the file extension)")
    if not array:
        return msg
    return (msg + "; convert it with python -c \"import json, sys; [print(json.dumps(r)) for r "
            f"in json.load(open(sys.argv[1]))]\" {path} > {os.path.splitext(path)[0]}.jsonl")


def check_fields(row: Any, required: Mapping[str, type | tuple[type, ...]],
                 optional: Mapping[str, type | tuple[type, ...]] = {}) -> None:
    """Raise RowError unless `row` is an object with every required field of the right type
    (non-empty if a string) and every optional field, when present and not null, typed."""
    if not isinstance(row, dict):
        raise RowError(f"row is a JSON {type(row).__name__}, expected an object")
    for name, typ in required.items():
        if name not in row or row[name] is None:
            raise RowError(f"missing field {name!r} (have: {sorted(row)})")
    for name, typ in {**optional, **required}.items():
        if row.get(name) is None:
            continue
        value = row[name]
        # bool is an int in Python, but a bool where a number belongs is a malformed row.
        if not isinstance(value, typ) or (isinstance(value, bool) and bool not in _types(typ)):
            raise RowError(f"field {name!r} should be {_type_names(typ)}, "
                           f"got {type(value).__name__} {value!r:.60}")
        if isinstance(value, str) and name in required and not value.strip():
            raise RowError(f"field {name!r} is empty")


def load_examples(
    path: str | os.PathLike,
    convert: Converter,
    required: Mapping[str, type | tuple[type, ...]],
    optional: Mapping[str, type | tuple[type, ...]] = {},
    skip_invalid: bool = False,
    limit: int | None = None,
    split: str | None = None,
) -> Dataset:
    """Validate and convert every row of `path` (`split`: of a `datasets` source with
    several); see the module docstring for error handling."""
    path = os.fspath(path)
    name, label = os.path.basename(os.path.normpath(path)), path
    if split is not None and (is_hub_name(path) or has_split(path, split)):
        name, label = f"{name}/{split}", f"{path}/{split}"  # ids and errors name the split
    examples: list[Example] = []
    problems: list[str] = []
    skipped = 0
    for line_no, row in read_rows(path, split):
        if limit is not None and len(examples) >= limit:
            break
        try:
            if isinstance(row, DataError):
                raise RowError(str(row))
            check_fields(row, required, optional)
            examples.append(convert(row, f"{name}:{line_no}"))
        except Exception as e:  # noqa: BLE001 - every way a row can fail names its line
            where = f"{label}:{line_no}: {e if isinstance(e, RowError) else _reason(e)}"
            if not skip_invalid:
                raise DataError(where + " (pass skip_invalid=True to skip such rows)") from None
            skipped += 1
            if len(problems) < MAX_PROBLEMS_KEPT:
                problems.append(where)
    if not examples:
        raise DataError(f"{label}: no valid rows" + (f" ({skipped} skipped)" if skipped else ""))
    return Dataset(tuple(examples), label, skipped, tuple(problems))


def _types(typ) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _type_names(typ) -> str:
    return " or ".join(t.__name__ for t in _types(typ))
