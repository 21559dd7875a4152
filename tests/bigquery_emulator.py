"""A real BigQuery API server on loopback (bqemulator: REST and Storage Read gRPC over DuckDB).

Started like the GCS emulator: our own process, log to /dev/null, a free port, ready when the
REST API answers. bqemulator loads DuckDB's spatial and avro extensions at start and would
download them; the pinned ``duckdb-extension-*`` wheels ship them, and they are copied into a
private HOME where DuckDB looks first. Clients reach it through the emulator variables that
``components.warehouse.clients`` reads.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from google.cloud import bigquery

from components.warehouse.clients import REST_EMULATOR_VARIABLE, STORAGE_EMULATOR_VARIABLE
from tests.gcs_emulator import free_port

PROJECT = "test-project"
# The emulator sends up to 65,536 rows per Storage Read message whatever their width, and its gRPC
# send limit follows the Write API's request cap (10 MiB): a wide table (CiteSeer's 3,706 columns)
# overflows it. Real BigQuery sizes its messages itself; here the cap is raised.
_SERVER_SETTINGS = {"BQEMU_WRITE_API_MAX_REQUEST_BYTES": str(256 * 1024 * 1024)}
_STARTUP_ATTEMPTS = 3


class BigQueryEmulatorError(RuntimeError):
    """The emulator could not be started."""


def _extension_home() -> str:
    """A fresh HOME whose DuckDB extension folder holds the pinned extensions."""
    home = tempfile.mkdtemp(prefix="bqemulator-home-")
    version = duckdb.__version__
    target = os.path.join(home, ".duckdb", "extensions", f"v{version}", "linux_amd64")
    os.makedirs(target)
    site = os.path.dirname(os.path.dirname(duckdb.__file__))
    found = glob.glob(os.path.join(site, "duckdb_extension_*", "extensions", f"v{version}", "*.duckdb_extension"))
    if len(found) < 2:
        raise BigQueryEmulatorError(f"DuckDB {version}'s spatial and avro extensions are not installed (found {found})")
    for path in found:
        shutil.copy(path, target)
    return home


class BigQueryEmulator:
    """One ephemeral bqemulator process on two free loopback ports; a context manager."""

    def __init__(self, *, project: str = PROJECT, startup_timeout_s: float = 60.0, gcs_local_root: str | None = None) -> None:
        self.project = project
        # Where its load jobs read gs://bucket/path: gcs_local_root/bucket/path (BQEMU_GCS_LOCAL_ROOT),
        # the layout of a fake-gcs-server with its filesystem backend rooted there.
        self.gcs_local_root = gcs_local_root
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._home: str | None = None
        self.rest_port = 0
        self.grpc_port = 0

    @property
    def rest_url(self) -> str:
        """``BIGQUERY_EMULATOR_HOST``'s value."""
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_host(self) -> str:
        """``BIGQUERY_STORAGE_EMULATOR_HOST``'s value."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def environment(self) -> dict[str, str]:
        return {REST_EMULATOR_VARIABLE: self.rest_url, STORAGE_EMULATOR_VARIABLE: self.grpc_host}

    def _gcs_settings(self) -> dict[str, str]:
        return {"BQEMU_GCS_LOCAL_ROOT": self.gcs_local_root} if self.gcs_local_root else {}

    def start(self) -> None:
        self._home = _extension_home()
        executable = os.path.join(os.path.dirname(sys.executable), "bqemulator")
        for attempt in range(1, _STARTUP_ATTEMPTS + 1):
            self.rest_port, self.grpc_port = free_port(), free_port()
            command = [executable, "start", "--rest-host", "127.0.0.1", "--rest-port", str(self.rest_port)]
            command += ["--grpc-host", "127.0.0.1", "--grpc-port", str(self.grpc_port), "--project", self.project]
            command += ["--log-level", "error"]
            self._process = subprocess.Popen(
                command,
                env={**os.environ, "HOME": self._home, **_SERVER_SETTINGS, **self._gcs_settings()},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                self._wait_until_ready()
                return
            except BigQueryEmulatorError:
                self._stop_process()
                if attempt == _STARTUP_ATTEMPTS:
                    raise

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout_s
        url = f"{self.rest_url}/bigquery/v2/projects/{self.project}/datasets"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BigQueryEmulatorError(f"bqemulator exited with status {self._process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise BigQueryEmulatorError(f"bqemulator did not answer within {self._startup_timeout_s} s")

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def stop(self) -> None:
        self._stop_process()
        if self._home:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def __enter__(self) -> BigQueryEmulator:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self.stop()


def load_csv_table(client: bigquery.Client, table_id: str, csv_path: str) -> pd.DataFrame:
    """A CSV file (string ``*_id``/label/split/src/dst columns, integer features) as a new BigQuery
    table, by a Parquet load job as a user would load it; returns the rows as read."""
    text_columns = {"node_id": str, "label": str, "split": str, "src": str, "dst": str}
    frame = pd.read_csv(csv_path, dtype=text_columns)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    schema = [bigquery.SchemaField(f.name, "STRING" if pa.types.is_string(f.type) else "INT64") for f in table.schema]
    client.create_table(bigquery.Table(table_id, schema=schema))
    parquet = io.BytesIO()
    pq.write_table(table, parquet)
    parquet.seek(0)
    config = bigquery.LoadJobConfig(source_format=bigquery.SourceFormat.PARQUET, schema=schema, write_disposition="WRITE_APPEND")
    client.load_table_from_file(parquet, table_id, job_config=config).result(timeout=300)
    if client.get_table(table_id).num_rows != len(frame):
        raise BigQueryEmulatorError(f"loading {csv_path} into {table_id} gave {client.get_table(table_id).num_rows} rows, not {len(frame)}")
    return frame
