"""The package version (one home: ``schedsim.__version__`` and ``schedsim --version``)."""

__version__ = "0.1.0"
