"""onnxruntime's process logger: its severity (0 verbose .. 4 fatal) and the callback that
``set_default_logger_callback`` routes messages to. mixrt's sessions log through it what
onnxruntime's sessions log at the same severities: a model loaded and the device chosen
(verbose, info), an option or provider passed over (warning; that one is also a Python
warning, ``settings.py``). Without a callback, messages at the severity or worse go to the
``mixrt.onnxruntime`` logging logger.
"""

from __future__ import annotations

import logging
import threading

VERBOSE, INFO, WARNING, ERROR, FATAL = range(5)
_PYTHON_LEVELS = {VERBOSE: logging.DEBUG, INFO: logging.INFO, WARNING: logging.WARNING,
                  ERROR: logging.ERROR, FATAL: logging.CRITICAL}
_logger = logging.getLogger("mixrt.onnxruntime")
_state = {"severity": WARNING, "verbosity": 0, "callback": None}
_lock = threading.Lock()


def _checked_severity(severity) -> int:
    if not isinstance(severity, int) or not VERBOSE <= severity <= FATAL:
        raise RuntimeError(f"log severity {severity!r}: expected 0 (verbose) to 4 (fatal)")
    return severity


def set_default_logger_severity(severity: int) -> None:
    with _lock:
        _state["severity"] = _checked_severity(severity)


def set_default_logger_verbosity(verbosity: int) -> None:
    with _lock:
        _state["verbosity"] = int(verbosity)


def set_default_logger_callback(callback, severity: int = WARNING) -> None:
    """Send log messages at ``severity`` or worse to ``callback(severity, category, logid,
    code_location, message)``; None restores the default (the logging module)."""
    if callback is not None and not callable(callback):
        raise RuntimeError(f"set_default_logger_callback: {callback!r} is not callable")
    severity = _checked_severity(severity)
    with _lock:
        _state["callback"] = callback
        _state["severity"] = severity


def log(severity: int, logid: str, message: str, *, session_severity: int = -1) -> None:
    """One message; ``session_severity`` (a session's own log_severity_level, -1 for the
    process's) decides whether it is written."""
    threshold = _state["severity"] if session_severity < 0 else session_severity
    if severity < threshold:
        return
    callback = _state["callback"]
    if callback is None:
        _logger.log(_PYTHON_LEVELS[severity], "[%s] %s", logid or "mixrt", message)
        return
    try:
        callback(severity, "mixrt", logid or "", "mixrt.onnxruntime", message)
    except Exception:  # a callback's error must not fail a session; onnxruntime's does not
        _logger.exception("the log callback raised on: %s", message)
