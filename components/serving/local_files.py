"""A published output's files as local paths the server can memory-map, checked against its manifest.

A local output is used where it lies; a ``gs://`` one is copied once into the cache folder
(``<cache>/<step>-<generation>/``), file by file as the server asks for them. Every file is
checked against the size and CRC32C its manifest records, as ``storage.read_verified`` does,
but read in chunks through a small buffer: checking never pulls a file into the process's
anonymous memory (what is read lands in the page cache, which the kernel can drop). A copy
that passed its check is marked (``<file>.verified``), so a restart over the same cache does
not read it again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import google_crc32c

from components import storage
from components.storage.integrity import DamagedFile

_CHUNK = 1 << 22


def default_cache_dir() -> str:
    """Where derived files go when the caller names no cache folder."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "gnnflow", "serving")


def _crc32c_of_file(path: str) -> tuple[int, str]:
    crc = google_crc32c.Checksum()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc.update(chunk)
            size += len(chunk)
    return size, crc.hexdigest().decode()


def check_file(path: str, published: storage.PublishedOutput, relative_path: str) -> None:
    """The named :class:`DamagedFile` error unless ``path`` holds what the manifest records."""
    expected = published.expected(relative_path)
    size, crc = _crc32c_of_file(path)
    uri = published.uri(relative_path)
    if size != expected.entry.size:
        raise DamagedFile(
            f"{uri} is damaged: it has {size} bytes, {expected.recorded_in} records {expected.entry.size} bytes "
            f"with CRC32C {expected.entry.crc32c}{expected.advice()}"
        )
    if crc != expected.entry.crc32c:
        raise DamagedFile(
            f"{uri} is damaged: its CRC32C is {crc}, {expected.recorded_in} records {expected.entry.crc32c}{expected.advice()}"
        )


@dataclass(frozen=True)
class LocalOutput:
    """A published output whose files are reachable as local paths.

    ``derived``: a folder of this cache for files built from this output (CSR adjacency, id
    index), named by the output's generation so a new publication never reuses stale ones.
    """

    published: storage.PublishedOutput
    derived: str
    _copies: str | None  # where gs:// files are copied; None for a local output

    @staticmethod
    def open(uri: str, step: str, cache_dir: str) -> LocalOutput:
        published = storage.open_published(uri, step=step)
        key = hashlib.sha256(f"{published.root}|{published.manifest.generation}".encode()).hexdigest()[:16]
        folder = os.path.join(cache_dir, f"{step}-{published.manifest.generation}-{key}")
        os.makedirs(folder, exist_ok=True)
        copies = None if isinstance(published.root, storage.LocalUri) else os.path.join(folder, "files")
        return LocalOutput(published, os.path.join(folder, "derived"), copies)

    def path(self, relative_path: str) -> str:
        """A local, checked path of a file the manifest lists."""
        uri = self.published.uri(relative_path)  # names the output when the file is not listed
        if self._copies is None:
            path = uri.path  # type: ignore[attr-defined]
            check_file(path, self.published, relative_path)
            return path
        path = os.path.join(self._copies, relative_path)
        marker = f"{path}.verified"
        entry = self.published.manifest.files[relative_path]
        if os.path.exists(marker) and open(marker).read() == entry.crc32c:  # noqa: SIM115 - a tiny marker
            return path
        partial = f"{path}.partial"
        storage.download_file(uri, partial)
        check_file(partial, self.published, relative_path)
        os.replace(partial, path)
        with open(marker, "w") as handle:
            handle.write(entry.crc32c)
        return path

    def derived_path(self, name: str) -> str:
        os.makedirs(self.derived, exist_ok=True)
        return os.path.join(self.derived, name)
