"""Atomic directory writes: build a directory under a staging name, then move it into place in one rename.

A crash while writing leaves the staging directory (removed by the next attempt) and never a half-written
directory under the final name. Replacing an existing directory takes two renames (old aside, new in place);
a crash between them leaves the new one under the staging name and the old one under `.{name}.old`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def staging_path(final: str | os.PathLike) -> Path:
    """The staging directory for `final`: a hidden sibling, on the same filesystem so the rename is atomic."""
    final = Path(final)
    return final.parent / f".{final.name}.tmp"


def prepare_staging(final: str | os.PathLike) -> Path:
    """Creates an empty staging directory for `final` (removing a leftover one) and returns its path."""
    staging = staging_path(final)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` through a hidden sibling and one rename: a reader (or a kill) sees the old file or
    the whole new one, never half of it. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with temp.open("w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def commit_directory(staging: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Moves the finished `staging` directory to `final`, replacing what was there; returns `final`."""
    staging, final = Path(staging), Path(final)
    if not staging.is_dir():
        raise FileNotFoundError(f"commit_directory: staging directory {staging} does not exist")
    if final.exists():
        old = final.parent / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old)
    else:
        os.replace(staging, final)
    _fsync_directory(final.parent)
    return final
