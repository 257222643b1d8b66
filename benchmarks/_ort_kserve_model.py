"""onnxruntime behind KServe's Python model server, the baseline ``serve_bench.py`` puts beside
``mixrt serve`` (the same server framework): a ``kserve.Model`` over an
``onnxruntime.InferenceSession``, answering the Open Inference Protocol (v2) over REST and
gRPC.

    python benchmarks/_ort_kserve_model.py --model_dir DIR --model_name NAME \\
        --http_port P --grpc_port Q [--intra-op-threads N]

``DIR`` holds ``model.onnx`` (or one ``.onnx`` file), as KServe's storage initializer lays out
``/mnt/models``. ``--model_name``, ``--http_port``, ``--grpc_port`` and KServe's other flags
are KServe's own (``kserve.model_server`` reads them when it is imported); ``--model_dir``
and ``--intra-op-threads`` are this script's.

``load`` opens the session (CPUExecutionProvider, onnxruntime's default options; its
intra-op threads where given) and runs it once; ``predict`` decodes the request's tensors
with ``InferInput.as_numpy``, runs the session on one thread beside the event loop (as
mixrt's runtime does: one run at a time, the session spreading it over the cores), and
answers each output in binary where the request asked for it (the request's
``binary_data_output``, or the output's own ``binary_data``; over gRPC, binary where the
inputs came as raw bytes), else as JSON data. There is no batching: KServe's Python server
has none (KServe joins requests in a separate agent beside the server, not in it).
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kserve
import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, model_server
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import RequestedOutput
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid

_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def model_file(folder: Path) -> Path:
    """``folder/model.onnx``, or the one ``.onnx`` file in ``folder``."""
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    found = sorted(folder.glob("*.onnx"))
    if len(found) != 1:
        raise SystemExit(f"{folder}: no model.onnx, and {len(found)} .onnx files, not one")
    return found[0]


class OrtModel(kserve.Model):
    def __init__(self, name: str, path: Path, intra_op_threads: int = 0):
        super().__init__(name)
        self.path = path
        self.intra_op_threads = intra_op_threads
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"ort-{name}")

    def load(self) -> bool:
        options = ort.SessionOptions()
        if self.intra_op_threads:
            options.intra_op_num_threads = self.intra_op_threads
        self._session = ort.InferenceSession(str(self.path), options,
                                             providers=["CPUExecutionProvider"])
        feeds = {}
        for item in self._session.get_inputs():  # one warm-up run at one row
            shape = [1 if not isinstance(d, int) else d for d in item.shape]
            feeds[item.name] = np.zeros(shape, _DTYPES.get(item.type, np.float32))
        self._session.run(None, feeds)
        self._dtypes = {i.name: _DTYPES.get(i.type) for i in self._session.get_inputs()}
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.ready = True
        return self.ready

    def stop(self) -> None:
        self.ready = False
        self._executor.shutdown(wait=True)

    async def predict(self, payload: InferRequest, headers=None) -> InferResponse:
        feeds = {}
        for item in payload.inputs:
            if item.name not in self._dtypes:
                raise InvalidInput(f"model {self.name} has no input '{item.name}'")
            array = item.as_numpy()
            wanted = self._dtypes[item.name]
            feeds[item.name] = np.ascontiguousarray(
                array if wanted is None else array.astype(wanted, copy=False))
        asked = payload.request_outputs or []
        names = [o.name for o in asked] or self._outputs
        unknown = [name for name in names if name not in self._outputs]
        if unknown:
            raise InvalidInput(f"model {self.name} has no output {', '.join(unknown)}")
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self._session.run, names, feeds)
        # an output's own binary_data overrides the request's binary_data_output
        binary = dict.fromkeys(names, payload.use_binary_outputs)
        binary.update((o.name, bool(o.binary_data)) for o in asked if o.binary_data is not None)
        outputs = []
        for name, array in zip(names, results):
            output = InferOutput(name, list(array.shape), from_np_dtype(array.dtype))
            output.set_data_from_numpy(array, binary_data=binary[name])
            outputs.append(output)
        # InferResponse.to_rest takes each requested output's binary_data as given, None
        # (JSON) where only the request asked: hand it the choices made here
        return InferResponse(
            response_id=payload.id or generate_uuid(), model_name=self.name,
            infer_outputs=outputs, use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=[RequestedOutput(name, {"binary_data": binary[name]})
                               for name in names])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="KServe's own flags (--model_name, --http_port, --grpc_port, --workers, ...) "
               "are read by kserve.model_server")
    parser.add_argument("--model_dir", type=Path, required=True,
                        help="the folder that holds model.onnx")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="onnxruntime's intra-op threads (default 0: its own choice)")
    # KServe's flags (--model_name, --http_port, ...) are read by kserve.model_server
    args, _ = parser.parse_known_args()
    model = OrtModel(model_server.args.model_name, model_file(args.model_dir),
                     args.intra_op_threads)
    model.load()
    kserve.ModelServer().start([model])


if __name__ == "__main__":
    main()
