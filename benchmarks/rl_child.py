"""The child process of `kljax bench rl`: one side (kljax, the peer, or the random model's export)
run in a fresh interpreter, its result written as JSON (`benchmarks.rl._run_child` starts it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.rl import export_random
from benchmarks.rl_kljax import kljax_side
from benchmarks.rl_peer import peer_side


def child_main(argv: list[str]) -> None:
    """Entry point of a child process: `SIDE SETTINGS_JSON OUT_JSON`, SIDE one of kljax, peer, export."""
    side, settings_path, out_path = argv
    settings = json.loads(Path(settings_path).read_text())
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, settings["cpus"])
    if side == "export":
        export_random(settings)
        result: dict[str, Any] = {}
    elif side == "peer":
        result = peer_side(settings)
    else:
        result = kljax_side(settings)
    result["peak_rss_mb"] = common.peak_rss_mb()
    Path(out_path).write_text(json.dumps(result))
