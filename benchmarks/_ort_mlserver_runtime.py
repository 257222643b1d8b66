"""onnxruntime as an MLServer runtime, the baseline ``serve_bench.py`` puts behind the same
server framework as ``mixrt serve``: ``"implementation": "_ort_mlserver_runtime.OrtRuntime"``
in a model-settings.json whose ``parameters.uri`` names the ``.onnx`` file.

``load`` opens an ``onnxruntime.InferenceSession`` (CPUExecutionProvider, onnxruntime's
default options and threads) and runs it once; ``predict`` decodes the request's tensors with
MLServer's NumpyCodec, runs the session on one thread beside the event loop (as mixrt's
runtime does: one run at a time, the session spreading it over the cores), and encodes the
outputs with NumpyCodec. MLServer's adaptive batching (model-settings ``max_batch_size`` and
``max_batch_time``) joins requests along the first axis before they reach ``predict``.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


class OrtRuntime(MLModel):
    async def load(self) -> bool:
        uri = await get_model_uri(self.settings)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"ort-{self.name}")
        loop = asyncio.get_running_loop()
        self._session = await loop.run_in_executor(self._executor, self._open, uri)
        self._dtypes = {i.name: _DTYPES.get(i.type) for i in self._session.get_inputs()}
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    @staticmethod
    def _open(uri: str):
        session = ort.InferenceSession(uri, providers=["CPUExecutionProvider"])
        feeds = {}
        for item in session.get_inputs():  # one warm-up run at one row
            shape = [1 if not isinstance(d, int) else d for d in item.shape]
            feeds[item.name] = np.zeros(shape, _DTYPES.get(item.type, np.float32))
        session.run(None, feeds)
        return session

    async def unload(self) -> bool:
        self._executor.shutdown(wait=True)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {}
        for item in payload.inputs:
            if item.name not in self._dtypes:
                raise InferenceError(f"model {self.name} has no input '{item.name}'")
            array = NumpyCodec.decode_input(item)
            wanted = self._dtypes[item.name]
            feeds[item.name] = np.ascontiguousarray(
                array if wanted is None else array.astype(wanted, copy=False))
        names = [o.name for o in payload.outputs] if payload.outputs else self._outputs
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self._session.run, names, feeds)
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id,
            outputs=[NumpyCodec.encode_output(name, array)
                     for name, array in zip(names, results)])
