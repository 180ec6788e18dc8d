"""``python -m schedsim`` and the ``schedsim`` command: the stop signals' handler first
(:func:`schedsim.util.signals.stop_at_exit`: from the moment schedsim's code runs, a
SIGTERM/SIGHUP/SIGINT is one line and exit 128 + N, never a traceback), then the CLI."""
from __future__ import annotations


def main() -> None:
    """Console-script entry point."""
    from schedsim.util.signals import stop_at_exit

    stop_at_exit()
    from schedsim.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
