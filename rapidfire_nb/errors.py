"""Exceptions raised to users. Every message names what was wrong."""


class RapidFireError(Exception):
    """Base class of rapidfire_nb errors."""


class ConfigError(RapidFireError, ValueError):
    """An invalid configuration value; the message names the knob."""


class OpRefused(RapidFireError, ValueError):
    """An interactive-control op (stop/resume/delete/clone) was refused; the message says why."""


class MetadataError(RapidFireError):
    """experiment.json or runs.json is damaged; the message names the file and what is wrong."""


class RapidFireConfigWarning(UserWarning):
    """A config was accepted but changed: a removed knob mapped or dropped, or a precision setting
    that cannot run on this machine replaced by one that can.

    Filter it with ``warnings.filterwarnings("ignore", category=RapidFireConfigWarning)``. It lives
    here, below both layers, because the engine warns with it too; ``rapidfire_nb.automl`` re-exports it.
    """
