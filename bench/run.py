"""``make bench``: run every benchmark script in one go and collect bench/RESULTS.md.

Benchmarks are separate from the tests: they print ratios measured in one run on this machine
and each writes ``bench/<name>.json``; this runner turns those into one table.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = [
    "keyset",
    "archive_throughput",
    "sender_throughput",
    "restore_throughput",
    "metrics_scrape",
    "tick_scaling",
]


def main() -> int:
    failed = []
    for name in SCRIPTS:
        script = BENCH / f"{name}.py"
        if not script.exists():
            print(f"bench: {name}.py missing, skipped")
            continue
        print(f"bench: running {name} ...", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=BENCH.parent).returncode != 0:
            failed.append(name)
    lines = [
        "# Benchmark results",
        "",
        f"Last `make bench`: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}).",
        "Each number was measured in one run on a shared 2-core machine: compare ratios, not",
        "absolute rates.",
        "",
    ]
    for name in SCRIPTS:
        path = BENCH / f"{name}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        lines += [f"## {name}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in doc.items() if k != "measured_at_unix"]
        lines.append("")
    (BENCH / "RESULTS.md").write_text("\n".join(lines))
    print("bench: results in bench/RESULTS.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
