"""The runtime's errors: each message says what is wrong and what to do."""

from __future__ import annotations


class SetupError(RuntimeError):
    """A rank could not be set up; the message carries the cause and the fix."""


class DeviceError(SetupError):
    """The requested device cannot be used."""


class LaunchError(SetupError):
    """The launcher left the rank without what it needs (environment, arguments)."""
