"""``python -m masklab`` and the ``masklab`` command: :func:`masklab.cli.main`, with Ctrl-C
while the command's modules import (the studies, transformers) one line and exit 130, as it
is while the command runs."""

import sys


def run() -> int:
    try:
        from masklab.cli import main

        return main()
    except KeyboardInterrupt:
        print("masklab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
