"""A session's feeds as one run takes them: the names checked against the model's inputs
(unknown and missing ones refused), each value checked and converted against its declared
type (``runtime/feeds.py`` holds the per-value rules; the symbolic dimensions are checked
consistent across the inputs here), the shape signature a plan is cached under, and the
fast path that lets a repeated request's NumPy feeds pass as they are.

:class:`FeedChecks` is a part of :class:`~mixrt.runtime.session.Session` (its base
class): it reads the session's ``device``, ``_xp``, ``_feed_inputs`` and ``_required`` and
keeps ``_known_feeds``, the last checked feeds' key and signature (which the session's
steady lane reads too). It stands apart from the run machinery because it decides what a
run is given, not how it runs.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.feeds import (as_text, check_tensor, feed_signature, map_feed, python_feed,
                                 unicode_text)


class FeedChecks:
    """The feed-checking methods of :class:`~mixrt.runtime.session.Session`."""

    def _feeds_and_signature(self, feeds) -> tuple[dict, tuple]:
        """The checked feeds and their signature. CPU feeds that are NumPy arrays with the
        names, order, shapes and dtypes of the last ones checked as they were (no copy or
        conversion) pass as they are, with that signature (the same object, so the plan
        is found by identity): the full check and signature cost ~4 us a run."""
        known = self._known_feeds
        if known is not None and feeds.__class__ is dict:
            key = feed_key(feeds)
            if key is not None and key == known[0]:
                if known[2]:  # as _checked_feed converts them (np.vectorize: ~10 us a run)
                    feeds = dict(feeds)
                    for name in known[2]:
                        feeds[name] = feeds[name].astype(object)
                return feeds, known[1]
        checked = self._checked_feeds(feeds)
        signature = feed_signature(checked)
        if self._xp is np:
            texts = tuple(name for name, value in feeds.items()
                          if checked[name] is not value and unicode_text(value))
            if all(checked[name] is value or name in texts for name, value in feeds.items()):
                key = feed_key(feeds)
                if key is not None:
                    self._known_feeds = (key, signature, texts)
        return checked, signature

    def _checked_feeds(self, feeds: dict) -> dict:
        if not isinstance(feeds, dict):
            raise InputError(f"feeds must be a dict of input name -> array, got "
                             f"{type(feeds).__name__}")
        by_name = {v.name: v for v in self._feed_inputs}
        unknown = [n for n in feeds if n not in by_name]
        if unknown:
            raise InputError(f"feed(s) {unknown} are not inputs of this model; its inputs are "
                             f"{[v.name for v in self._feed_inputs]}")
        missing = [v.name for v in self._required if v.name not in feeds]
        if missing:
            raise InputError(f"missing feed(s) for input(s) {missing}")
        symbols: dict[str, tuple[str, int]] = {}
        return {name: self._checked_feed(by_name[name], value, symbols)
                for name, value in feeds.items()}

    def _checked_feed(self, declared, value, symbols):
        expected = declared.type
        if isinstance(expected, MapType):
            return map_feed(declared.name, value, expected)
        if isinstance(expected, SequenceType):
            if not isinstance(value, (list, tuple)):
                raise InputError(f"input {declared.name!r} is a sequence; feed a list of "
                                 f"arrays, got {type(value).__name__}")
            if isinstance(expected.element, MapType):
                return [map_feed(declared.name, v, expected.element) for v in value]
            return [self.device.put(np.asarray(v) if isinstance(v, (list, tuple)) else v)
                    for v in value]
        if isinstance(expected, OptionalType):
            if value is None:
                return None
            expected = expected.element
            if isinstance(expected, SequenceType):
                return [self.device.put(v) for v in value]
        if value is None:
            raise InputError(f"input {declared.name!r} is a tensor; got None")
        array = value if hasattr(value, "__array__") \
            or hasattr(value, "__cuda_array_interface__") \
            else python_feed(declared.name, value, expected)
        if isinstance(expected, TensorType):
            check_tensor(declared.name, array, expected, symbols)
            if expected.dtype == np.dtype(object) and np.dtype(array.dtype).kind in "US":
                # kernels see ONNX strings one way: object arrays of str
                array = np.vectorize(as_text, otypes=[object])(array)
        return self.device.put(array, f"input {declared.name!r}")

    def _static_feeds(self) -> dict:
        feeds = {}
        for value in self._required:
            value_type = value.type
            if not (isinstance(value_type, TensorType) and value_type.shape is not None
                    and all(isinstance(d, int) for d in value_type.shape)):
                raise InputError(f"input {value.name!r} has no static shape "
                                 f"({value_type}); pass feeds to plan for")
            feeds[value.name] = np.zeros(value_type.shape, dtype=value_type.dtype)
        return feeds


def feed_key(feeds: dict) -> tuple | None:
    """(name, shape, dtype) of each feed in order, when every one is a NumPy array."""
    key = []
    for name, value in feeds.items():
        if value.__class__ is not np.ndarray:
            return None
        key.append((name, value.shape, value.dtype))
    return tuple(key)
