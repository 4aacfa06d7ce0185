"""Low-level utilities every floor may use: paths kljax owns, re-running kljax in a new process,
running a user's code without letting it end the process, and host set-up for XLA on CPU."""
