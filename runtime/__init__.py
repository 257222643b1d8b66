"""The engine room: Graph IR, passes, planner, executor, devices."""

# MXNet's mx.runtime (this package under the mxnet alias): the build-feature query
from mixrt.runtime.features import Feature, Features, feature_list  # noqa: E402,F401
