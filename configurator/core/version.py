"""The tool's name and version (``pyproject.toml`` reads the version from here)."""

TOOL_NAME = "configurator"
__version__ = "0.2.0"


def tool_version() -> str:
    return __version__
