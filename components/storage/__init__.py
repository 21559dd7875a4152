"""Storage for step inputs and outputs: typed URIs, one file API, atomic publication."""

from components.storage.files import (
    copy_file,
    copy_tree,
    delete,
    delete_prefix,
    download_file,
    exists,
    expand_files,
    list_files,
    local_copy,
    open_read,
    open_write,
    read_bytes,
    read_text,
    size,
    upload_file,
    version,
    versions_below,
    write_bytes,
    write_text,
)
from components.storage.publish import (
    FileEntry,
    Manifest,
    OutputStaging,
    PublishedOutput,
    open_published,
    staged_output,
)
from components.storage.uri import GcsUri, LocalUri, Uri, parse_uri, relative_to

__all__ = [
    "FileEntry", "GcsUri", "LocalUri", "Manifest", "OutputStaging", "PublishedOutput", "Uri",
    "copy_file", "copy_tree", "delete", "delete_prefix", "download_file", "exists", "expand_files",
    "list_files", "local_copy", "open_published", "open_read", "open_write", "parse_uri",
    "read_bytes", "read_text", "relative_to", "size", "staged_output", "upload_file",
    "version", "versions_below", "write_bytes", "write_text",
]
