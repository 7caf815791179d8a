"""Worker process of :func:`masklab.lab.runner.run_study`: runs one spec, writes its result JSON.

Usage (internal): ``python -m masklab.lab.worker MODULE:FUNCTION SPEC.json RESULT.json THREADS [DEVICE PRECISION]``
(DEVICE ``cpu``/``cuda``/``cuda:N``, PRECISION ``fp32``/``bf16``/``fp16``; default cpu, fp32).
"""

from __future__ import annotations

import sys
from pathlib import Path

from masklab.util.errors import MasklabError
from masklab.util.files import read_json, write_json
from masklab.lab.runs import execute


def main(argv: list[str]) -> int:
    fn_path, spec_path, result_path, threads, *where = argv
    dev, precision = where if where else ("cpu", "fp32")
    spec = read_json(Path(spec_path))
    try:
        rec = execute(fn_path, spec, Path(spec_path).parent, int(threads), dev, precision)
    except MasklabError as e:  # the message alone: the parent reports the last line of this log
        print(str(e), file=sys.stderr)
        return 1
    write_json(Path(result_path), rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
