"""Arm ``ddp-exporter run`` in this process, then run the sitecustomize this one hides.

Python imports this at start-up because ``ddp-exporter run`` put its folder first on
``PYTHONPATH``. It must never stop the process: a failure is one line on standard error.
"""

import os
import sys


def _arm() -> None:
    try:
        import exporter.autorun

        exporter.autorun.arm()
    except Exception as exc:  # noqa: BLE001
        print(f"ddp-exporter run: not armed in this process ({exc!r})", file=sys.stderr)
        return
    # Outside the try: an error of the job's own sitecustomize is the job's, as without this.
    exporter.autorun.run_hidden_sitecustomize(os.path.dirname(__file__))


_arm()
