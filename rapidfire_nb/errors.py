"""Exceptions raised to users. Every message names what was wrong."""


class RapidFireError(Exception):
    """Base class of rapidfire_nb errors."""


class ConfigError(RapidFireError, ValueError):
    """An invalid configuration value; the message names the knob."""


class OpRefused(RapidFireError, ValueError):
    """An interactive-control op (stop/resume/delete/clone) was refused; the message says why."""
