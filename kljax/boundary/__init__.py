"""The one boundary for faults, entered only by the command line and the Python API: Ctrl-C, disk
faults, the workdir lock, reward isolation, and the policy that turns a user's error into one line."""
