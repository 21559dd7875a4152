"""What is read is what was written: every file a manifest (or a checkpoint record) lists is checked
against the size and CRC32C recorded for it, as it is read.

The check never reads a file twice. A whole-file read hashes the bytes it already holds (CRC32C
runs at about ten times the speed this machine reads from its page cache; see
``benchmarks/checksum_cost.py``); a stream hashes each chunk as it passes to its consumer and
compares before it hands over the last one, so a consumer never finishes on damaged bytes.
A damaged file fails the step with one line naming its URI, the size and checksum expected and
found, and what to do.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c

from components.errors import GnnflowError
from components.storage import files, gcs
from components.storage.uri import GcsUri, Uri, parse_uri


class DamagedFile(GnnflowError):
    """A file whose bytes are not what was recorded for it (as opposed to one that could not be read)."""


@dataclass(frozen=True)
class FileEntry:
    """One written file: its size in bytes and CRC32C (as GCS reports it, in hex)."""

    size: int
    crc32c: str

    @staticmethod
    def of(data: bytes) -> FileEntry:
        return FileEntry(len(data), crc32c_hex(data))


@dataclass(frozen=True)
class Expected:
    """What a file must hold, where that was recorded, and what to do when it does not."""

    entry: FileEntry
    recorded_in: str  # e.g. "its manifest gs://b/run/tfrecords/manifest.json"
    remedy: str = ""  # e.g. "re-run step 'serialize' to publish gs://b/run/tfrecords again"

    def advice(self) -> str:
        return f"; {self.remedy}" if self.remedy else ""


def crc32c_hex(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


def _size_error(uri: Uri | str, found: str, expected: Expected) -> DamagedFile:
    entry = expected.entry
    return DamagedFile(
        f"{uri} is damaged: it has {found} bytes, {expected.recorded_in} records {entry.size} bytes "
        f"with CRC32C {entry.crc32c}{expected.advice()}"
    )


def _crc_error(uri: Uri | str, actual: str, expected: Expected) -> DamagedFile:
    entry = expected.entry
    return DamagedFile(
        f"{uri} is damaged: its CRC32C is {actual}, {expected.recorded_in} records {entry.crc32c} "
        f"(same size, {entry.size} bytes){expected.advice()}"
    )


def verify(uri: Uri | str, data: bytes, expected: Expected) -> bytes:
    """``data`` (the bytes read from ``uri``) when they match ``expected``; the named error otherwise."""
    if len(data) != expected.entry.size:
        raise _size_error(uri, str(len(data)), expected)
    actual = crc32c_hex(data)
    if actual != expected.entry.crc32c:
        raise _crc_error(uri, actual, expected)
    return data


def read_verified(uri: Uri | str, expected: Expected) -> bytes:
    """The whole file, read once and checked against ``expected``."""
    uri = parse_uri(uri)
    # On GCS the library would hash the download too (against the object's own checksum, which a
    # rewritten object shares): the check against the manifest covers transport and storage at once.
    data = gcs.read_bytes(uri, checksum=None) if isinstance(uri, GcsUri) else files.read_bytes(uri)
    return verify(uri, data, expected)


class VerifyingReader(io.RawIOBase):
    """A binary stream over ``inner`` that hashes what it passes on and checks it at the end.

    The verdict comes before the last bytes are handed over: when the bytes read reach the
    recorded size the checksum is compared, and a stream that ends short, runs long or hashes
    differently raises the named error instead of returning its last chunk. A consumer that stops
    early (reading a footer only) gets no verdict. Seeking back (a retried upload rewinds) is
    allowed; seeking past the bytes already hashed is not, since they could not be checked.
    """

    mode = "rb"

    def __init__(self, inner: BinaryIO, uri: Uri | str, expected: Expected) -> None:
        super().__init__()
        self._inner = inner
        self._uri = uri
        self._expected = expected
        self._crc = google_crc32c.Checksum()
        self._position = 0
        self._hashed = 0
        self._verified = False
        self.name = str(uri)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._position + offset}.get(whence)
        if target is None or target > self._hashed:
            raise io.UnsupportedOperation(f"{self._uri}: a checked stream only seeks back within what it has read")
        self._inner.seek(target)
        self._position = target
        return target

    def read(self, size: int | None = -1) -> bytes:
        wanted = -1 if size is None or size < 0 else size
        data = self._inner.read(wanted)
        self._take(data, at_end=wanted < 0 or (wanted != 0 and not data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:  # noqa: ANN001 - any writable buffer
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()

    def _take(self, data: bytes, at_end: bool) -> None:
        end = self._position + len(data)
        if end > self._hashed:
            self._crc.update(data[self._hashed - self._position :] if self._hashed > self._position else data)
            self._hashed = end
        self._position = end
        expected = self._expected
        if self._hashed > expected.entry.size:
            raise _size_error(self._uri, f"more than {expected.entry.size}", expected)
        if self._verified:
            return
        if self._hashed == expected.entry.size:
            actual = self._crc.hexdigest().decode()
            if actual != expected.entry.crc32c:
                raise _crc_error(self._uri, actual, expected)
            self._verified = True
        elif at_end:
            raise _size_error(self._uri, f"only {self._hashed}", expected)
