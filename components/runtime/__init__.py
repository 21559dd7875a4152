"""What every step's processes run on: the launcher of worker processes, their rendezvous,
collectives, watchdog, leaked-resource tracking, logging and progress, and the entry points of
the step commands and KFP components."""
