"""BigQuery: table references, clients that honour the emulator convention, reads and loads."""
