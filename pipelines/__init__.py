"""The DAG and the commands that run, compile, submit and schedule it."""
