"""Exceptions raised to users. Every message names what was wrong."""


class RapidFireError(Exception):
    """Base class of rapidfire_nb errors."""


class _OneLineInNotebooks:
    """A refusal of the user's input already says what is wrong and how to fix it: IPython and
    ipykernel show it as that one line (``_render_traceback_``) instead of forty lines of frames
    through the package. Plain Python, logs and ``%debug`` keep the whole traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class ConfigError(_OneLineInNotebooks, RapidFireError, ValueError):
    """An invalid configuration value; the message names the knob."""


class OpRefused(_OneLineInNotebooks, RapidFireError, ValueError):
    """An interactive-control op (stop/resume/delete/clone) was refused; the message says why."""


class MetadataError(RapidFireError):
    """experiment.json or runs.json is damaged; the message names the file and what is wrong."""


class RapidFireConfigWarning(UserWarning):
    """A config was accepted but changed: a removed knob mapped or dropped, or a precision setting
    that cannot run on this machine replaced by one that can.

    Filter it with ``warnings.filterwarnings("ignore", category=RapidFireConfigWarning)``. It lives
    here, below both layers, because the engine warns with it too; ``rapidfire_nb.automl`` re-exports it.
    """
