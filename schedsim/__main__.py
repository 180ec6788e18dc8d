"""``python -m schedsim`` and the ``schedsim`` command: the stop signals' handler first
(:func:`schedsim.util.signals.stop_at_exit`: from the moment schedsim's code runs, a
SIGTERM/SIGHUP/SIGINT is one line and exit 128 + N, never a traceback), then the CLI.

Two settings of the command's start-up, here only (the library's API keeps the defaults):
the cyclic garbage collector is paused until the command runs
(:func:`schedsim.util.gc.pause_startup`), and pydantic's plugins are off
(``PYDANTIC_DISABLE_PLUGINS=__all__`` unless the variable is set: pydantic's first
validator would otherwise read every installed package's entry points to find its plugins,
about 22 M instructions, 1.6% of a small ``simulate``; set it to an empty value to load
them).
"""
from __future__ import annotations


def main() -> None:
    """Console-script entry point."""
    from schedsim.util.signals import stop_at_exit

    stop_at_exit()
    import os

    from schedsim.util.gc import pause_startup

    pause_startup()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from schedsim.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
