"""``python -m simulator``: the command line (:func:`simulator.cli.main`).

A finished command leaves without tearing its objects down one by one: a run's tables of
hundreds of thousands of rows and the event loop's state take ~0.15 s to free at exit (the
Vidur workload, docs/performance.md), and every file is already written and closed. The
streams are flushed first. A command that loaded Ray exits normally, so that Ray's own exit
handlers disconnect the driver from a cluster it did not start.
"""

import os
import sys

try:
    from simulator.cli import main
except KeyboardInterrupt:  # Ctrl-C while the libraries load: one line, as in a command
    print("interrupted (Ctrl-C)", file=sys.stderr)
    os._exit(130)

rc = main()
if "ray" in sys.modules:
    raise SystemExit(rc)
try:
    sys.stdout.flush()
    sys.stderr.flush()
except (BrokenPipeError, ValueError):  # a closed reader (`| head`): nothing left to say
    pass
os._exit(rc if isinstance(rc, int) else (0 if rc is None else 1))
